/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/dsa.c - the runner's sidecar of DSA indexer keys and the top-k selection
 * (see dsa.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsa.h"
#include "kernels/sparse.h"
#include "util.h"

#define HF_SIDECAR_MAGIC UINT64_C(0x3143445348564b) /* "KVHSDC1" */

int
hf_sidecar_init(struct hf_sidecar *sc, uint32_t n_layers, uint32_t dim, uint32_t cap)
{
	memset(sc, 0, sizeof(*sc));
	sc->n_layers = n_layers;
	sc->dim = dim;
	sc->cap = cap;
	for (int i = 0; i < HF_SIDECAR_SEQS; i++) {
		sc->s[i].keys = calloc((size_t)n_layers * cap * dim + 1, sizeof(float));
		if (!sc->s[i].keys) {
			hf_sidecar_fini(sc);
			return kvtr_err(-ENOMEM, "out of memory for the indexer keys");
		}
	}
	return 0;
}

void
hf_sidecar_fini(struct hf_sidecar *sc)
{
	for (int i = 0; i < HF_SIDECAR_SEQS; i++)
		free(sc->s[i].keys);
	memset(sc, 0, sizeof(*sc));
}

static struct hf_sidecar_seq *
sc_find(const struct hf_sidecar *sc, kvt_seq_id seq)
{
	for (int i = 0; seq && i < HF_SIDECAR_SEQS; i++)
		if (sc->s[i].seq == seq)
			return (struct hf_sidecar_seq *)&sc->s[i];
	return NULL;
}

int
hf_sidecar_open(struct hf_sidecar *sc, kvt_seq_id seq)
{
	if (!seq || sc_find(sc, seq))
		return kvtr_err(-EEXIST, "indexer keys: sequence %llu already has an entry",
				(unsigned long long)seq);
	for (int i = 0; i < HF_SIDECAR_SEQS; i++)
		if (!sc->s[i].seq) {
			sc->s[i].seq = seq;
			sc->s[i].n = 0;
			return 0;
		}
	return kvtr_err(-ENOSPC, "indexer keys: more than %d sequences", HF_SIDECAR_SEQS);
}

void
hf_sidecar_close(struct hf_sidecar *sc, kvt_seq_id seq)
{
	struct hf_sidecar_seq *s = sc_find(sc, seq);

	if (s) {
		s->seq = 0;
		s->n = 0;
	}
}

float *
hf_sidecar_row(struct hf_sidecar *sc, kvt_seq_id seq, uint32_t layer, uint32_t pos)
{
	struct hf_sidecar_seq *s = sc_find(sc, seq);

	if (!s || layer >= sc->n_layers || pos > s->n || pos >= sc->cap)
		return NULL;
	return s->keys + ((size_t)layer * sc->cap + pos) * sc->dim;
}

int
hf_sidecar_commit(struct hf_sidecar *sc, kvt_seq_id seq, uint32_t pos)
{
	struct hf_sidecar_seq *s = sc_find(sc, seq);

	if (!s)
		return kvtr_err(-ENOENT, "indexer keys: no entry for sequence %llu",
				(unsigned long long)seq);
	if (pos != s->n || pos >= sc->cap)
		return kvtr_err(-EINVAL, "indexer keys: position %u committed after %u", pos, s->n);
	s->n = pos + 1;
	return 0;
}

int
hf_sidecar_attach(struct hf_sidecar *sc, kvt_seq_id dst, kvt_seq_id src, uint32_t n)
{
	struct hf_sidecar_seq *d = sc_find(sc, dst), *s = sc_find(sc, src);

	if (!d || !s)
		return kvtr_err(-ENOENT, "indexer keys: no entry for sequence %llu",
				(unsigned long long)(d ? src : dst));
	if (n > s->n || d->n)
		return kvtr_err(-EINVAL, "indexer keys: attaching %u keys of %u to a sequence "
				"holding %u", n, s->n, d->n);
	for (uint32_t l = 0; l < sc->n_layers; l++)
		memcpy(d->keys + (size_t)l * sc->cap * sc->dim,
		       s->keys + (size_t)l * sc->cap * sc->dim, (size_t)n * sc->dim * sizeof(float));
	d->n = n;
	return 0;
}

int
hf_sidecar_save(const struct hf_sidecar *sc, kvt_seq_id seq, const char *path)
{
	const struct hf_sidecar_seq *s = sc_find(sc, seq);
	uint64_t hdr[4];
	char tmp[4200];
	FILE *f;
	int ok;

	if (!s)
		return kvtr_err(-ENOENT, "indexer keys: no entry for sequence %llu",
				(unsigned long long)seq);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "wb");
	if (!f)
		return kvtr_err(-errno, "cannot create %s: %s", tmp, strerror(errno));
	hdr[0] = HF_SIDECAR_MAGIC;
	hdr[1] = sc->n_layers;
	hdr[2] = sc->dim;
	hdr[3] = s->n;
	ok = fwrite(hdr, sizeof(hdr), 1, f) == 1;
	for (uint32_t l = 0; ok && l < sc->n_layers; l++)
		ok = s->n == 0 || fwrite(s->keys + (size_t)l * sc->cap * sc->dim,
					 (size_t)s->n * sc->dim * sizeof(float), 1, f) == 1;
	ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
	if (fclose(f) != 0)
		ok = 0;
	if (!ok || rename(tmp, path) != 0) {
		unlink(tmp);
		return kvtr_err(-EIO, "cannot write the indexer keys to %s", path);
	}
	return 0;
}

int
hf_sidecar_load(struct hf_sidecar *sc, kvt_seq_id seq, const char *path)
{
	struct hf_sidecar_seq *s = sc_find(sc, seq);
	uint64_t hdr[4];
	FILE *f;
	int ok;

	if (!s)
		return kvtr_err(-ENOENT, "indexer keys: no entry for sequence %llu",
				(unsigned long long)seq);
	f = fopen(path, "rb");
	if (!f)
		return kvtr_err(-errno, "cannot open %s: %s", path, strerror(errno));
	if (fread(hdr, sizeof(hdr), 1, f) != 1 || hdr[0] != HF_SIDECAR_MAGIC ||
	    hdr[1] != sc->n_layers || hdr[2] != sc->dim || hdr[3] > sc->cap) {
		fclose(f);
		return kvtr_err(KVT_EFORMAT, "%s is not an indexer key file of %u layers of %u "
				"floats", path, sc->n_layers, sc->dim);
	}
	ok = 1;
	for (uint32_t l = 0; ok && l < sc->n_layers; l++)
		ok = hdr[3] == 0 || fread(s->keys + (size_t)l * sc->cap * sc->dim,
					  (size_t)hdr[3] * sc->dim * sizeof(float), 1, f) == 1;
	fclose(f);
	if (!ok)
		return kvtr_err(KVT_EFORMAT, "%s is truncated", path);
	s->n = (uint32_t)hdr[3];
	return 0;
}

int
hf_dsa_select(const float *q, const float *w, uint32_t n_heads, uint32_t dim, const float *keys,
	      uint32_t pos, uint32_t topk, float *scores, uint32_t *out)
{
	float scale = (float)pow((double)dim, -0.5);
	int rc;

	rc = kvt_dsa_index_scores_ref(q, w, n_heads, dim, scale, keys, dim, (uint64_t)pos + 1,
				      scores);
	if (rc)
		return kvtr_err_kvt(rc, "kvt_dsa_index_scores_ref");
	rc = kvt_topk_blocks(scores, pos + 1, topk, out);
	if (rc < 0)
		return kvtr_err_kvt(rc, "kvt_topk_blocks");
	return rc;
}
