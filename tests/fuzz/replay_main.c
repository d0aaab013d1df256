/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/replay_main.c - replays every file of a corpus directory through the fuzz target
 * (ctest: fuzz_format_corpus), plus every truncation and single-byte corruption of each file,
 * so the parsers' bounds checks run on every build without libFuzzer. Exits 1 if the corpus
 * is missing or empty, or if a valid seed stopped parsing (the seeds named *.ok must parse at
 * least one record or header).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long
replay_file(const char *path, int *bad)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf, *mut;
	long n, runs = 0;

	if (!f)
		return 0;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(n > 0 ? (size_t)n : 1);
	mut = malloc(n > 0 ? (size_t)n : 1);
	if (!buf || !mut || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(buf);
		free(mut);
		return 0;
	}
	fclose(f);
	if (strstr(path, ".ok") && kvt_fmt_fuzz_one(buf, (size_t)n) == 0) {
		struct kvt_fmt_super s;
		struct kvt_fmt_blkhdr h;

		if (kvt_fmt_super_decode(buf, (size_t)n, &s) &&
		    kvt_fmt_blkhdr_decode(buf, (size_t)n, &h)) {
			fprintf(stderr, "%s: valid seed no longer parses\n", path);
			*bad = 1;
		}
	}
	for (long len = 0; len <= n; len += len < 256 ? 1 : 61, runs++) {
		memcpy(mut, buf, (size_t)len); /* exact-size copy: ASan sees any overread */
		LLVMFuzzerTestOneInput(mut, (size_t)len);
	}
	for (long i = 0; i < n; i += 1 + i / 64, runs++) {
		memcpy(mut, buf, (size_t)n);
		mut[i] ^= 0x41;
		LLVMFuzzerTestOneInput(mut, (size_t)n);
	}
	free(buf);
	free(mut);
	return runs;
}

int
main(int argc, char **argv)
{
	char path[4096];
	struct dirent *de;
	long runs = 0, files = 0;
	int bad = 0;
	DIR *d;

	if (argc != 2 || !(d = opendir(argv[1]))) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 1;
	}
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/%s", argv[1], de->d_name);
		runs += replay_file(path, &bad);
		files++;
	}
	closedir(d);
	printf("replayed %ld inputs from %ld corpus files\n", runs, files);
	return files == 0 || bad;
}
