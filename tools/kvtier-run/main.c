/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/main.c - command line of kvtier-run, the reference decode runner: it loads a
 * llama2.c model and tokenizer (or the built-in ones), runs the sessions through kvtier (see
 * runner.h) and prints the text as llama2.c does. Only argument handling lives here.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "runner.h"
#include "tokenizer.h"
#include "util.h"

/* --seed when not given with the built-in model: its text is then always the same */
#define MAIN_BUILTIN_SEED 1

struct main_args {
	const char *model;      /* --model, NULL = built-in */
	const char *tokenizer;  /* --tokenizer, NULL = built-in */
	const char *stats_json; /* --stats-json */
	const char *metrics;    /* --metrics: file for the Prometheus text, "-" = stdout */
	uint64_t seed;          /* --seed, 0 = default (see main_seed) */
	int seed_given;         /* 1 when --seed was on the command line */
	FILE *stats;            /* --stats-json opened before the run (not truncated), or NULL */
	int stats_created;      /* 1: the stats file did not exist before (removed on failure) */
	FILE *metrics_f;        /* --metrics file opened before the run, or NULL (none, "-") */
	int metrics_created;    /* 1: the metrics file did not exist before (removed on failure) */
};

static void
main_usage(FILE *f)
{
	fputs("usage: kvtier-run [options]\n"
	      "Decode a llama2.c model on the CPU with its KV cache in kvtier (HBM/host/NVMe).\n"
	      "Without --model it runs a built-in model and tokenizer (random weights: the\n"
	      "text is gibberish); its default seed is then 1, not the clock, so its text is\n"
	      "the same on every run. After the run stderr has a summary of what kvtier did\n"
	      "(blocks per tier at the end, blocks moved per direction, NVMe checksums\n"
	      "verified) and the tok/s figure.\n"
	      "  --model F             llama2.c checkpoint (e.g. stories260K.bin; not GGUF);\n"
	      "                        needs --tokenizer\n"
	      "  --tokenizer F         llama2.c tokenizer.bin (e.g. tok512.bin); default:\n"
	      "                        built-in, which fits only the built-in model\n"
	      "  --prompt S            prompt of every turn (default: built-in prompts; the first\n"
	      "                        turn of session 1 is empty, as llama2.c's default)\n"
	      "  --steps N             positions per turn, prompt included (default 256;\n"
	      "                        0 = seq_len); a longer prompt is cut, with a warning\n"
	      "  --temperature T       0 = greedy (default 1.0)\n"
	      "  --topp P              top-p in (0,1); 0 or 1: plain sampling (default 0.9)\n"
	      "  --seed S              rng seed, used when temperature > 0; session i uses S + i\n"
	      "                        (default: the clock with --model, 1 without; 0 = clock)\n"
	      "  --sessions N          concurrent chat sessions (default 1)\n"
	      "  --turns T             turns per session; sessions are parked between turns\n"
	      "                        (default 1)\n"
	      "  --hbm SIZE            HBM tier bytes (default: room for all;\n"
	      "                        at least 2 blocks when a session outgrows one block)\n"
	      "  --host SIZE           pinned host tier bytes (default: room for all)\n"
	      "  --nvme-dir D          directory of the NVMe tier (default: a temp dir)\n"
	      "  --nvme SIZE           NVMe tier bytes (default: room for all): its slots of\n"
	      "                        4 KiB + the block rounded up to 4 KiB; the file in\n"
	      "                        --nvme-dir is 1 MiB (superblock area) + the slots, so\n"
	      "                        up to 1 MiB more than SIZE\n"
	      "  --tokens-per-block B  tokens per KV block (default 16)\n"
	      "  --kv-dtype T          f32 (default), f16 or bf16 (--reference too)\n"
	      "  --reference           contiguous KV cache, no kvtier (the comparison baseline)\n"
	      "  --device D            emu (default: host memory stands in for the GPU) or\n"
	      "                        cuda (HBM on GPU 0, attention by the CUDA kernel)\n"
	      "  --prefix-share        sessions attach the prompt blocks session 0 computed\n"
	      "                        (kvtier prefix sharing); the text is unchanged\n"
	      "  --emu-delay-us N      emulated device: delay/reorder copies up to N us\n"
	      "                        (default 0)\n"
	      "  --emu-bandwidth B     emulated device: copy bandwidth in bytes/s (a SIZE;\n"
	      "                        default unlimited)\n"
	      "  --prefetch            schedule hints: promote the next group/window while the\n"
	      "                        current one computes (groups/windows use half of HBM)\n"
	      "  --stats-json F        write tier/transfer statistics as JSON to F\n"
	      "  --metrics F           write the engine's counters at the end in the Prometheus\n"
	      "                        text format to F (- = stdout, after the text)\n"
	      "                        Both files are checked (opened) before the run and written\n"
	      "                        only when it succeeds: after a failed run an earlier file\n"
	      "                        is left as it was, a new one is removed.\n"
	      "  --remote HOST:PORT    a Redis 7 / Valkey server as the REMOTE tier: sessions\n"
	      "                        move between processes (with --remote-save/-resume)\n"
	      "  --remote-user U, --remote-password P   AUTH for it (ACL user, password)\n"
	      "  --remote-save K       run turns 1..K of the --turns chat, then publish every\n"
	      "                        session (key = its number) to REMOTE\n"
	      "  --remote-resume K     reopen every session from REMOTE (it holds turns 1..K)\n"
	      "                        and run turns K+1..--turns; --temperature 0 only. The\n"
	      "                        turns printed by both equal one process's --turns run\n"
	      "  -h, --help            this text\n"
	      "SIZE: bytes with an optional fraction and binary K, M, G, T or P suffix (64M,\n"
	      "1.5G, 4T), at most 1 PiB. With one session and one turn stdout is only the\n"
	      "generated text, as llama2.c prints it; otherwise each turn's text is printed\n"
	      "as \"[session S turn T] text\".\n"
	      "Exit status: 0 done; 2 usage error (bad option or value, --stats-json or\n"
	      "--metrics file that cannot be written), before anything runs; 1 the run failed.\n",
	      f);
}

enum {
	OPT_MODEL = 256, OPT_TOKENIZER, OPT_PROMPT, OPT_STEPS, OPT_TEMP, OPT_TOPP, OPT_SEED,
	OPT_SESSIONS, OPT_TURNS, OPT_HBM, OPT_HOST, OPT_NVME_DIR, OPT_NVME, OPT_TPB, OPT_DTYPE,
	OPT_REFERENCE, OPT_EMU_DELAY, OPT_STATS, OPT_METRICS, OPT_HELP, OPT_DEVICE,
	OPT_PREFIX_SHARE, OPT_PREFETCH, OPT_BANDWIDTH,
	OPT_REMOTE, OPT_REMOTE_USER, OPT_REMOTE_PASSWORD, OPT_REMOTE_SAVE, OPT_REMOTE_RESUME,
};

static const struct option main_opts[] = {
	{ "model", required_argument, NULL, OPT_MODEL },
	{ "tokenizer", required_argument, NULL, OPT_TOKENIZER },
	{ "prompt", required_argument, NULL, OPT_PROMPT },
	{ "steps", required_argument, NULL, OPT_STEPS },
	{ "temperature", required_argument, NULL, OPT_TEMP },
	{ "topp", required_argument, NULL, OPT_TOPP },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "sessions", required_argument, NULL, OPT_SESSIONS },
	{ "turns", required_argument, NULL, OPT_TURNS },
	{ "hbm", required_argument, NULL, OPT_HBM },
	{ "host", required_argument, NULL, OPT_HOST },
	{ "nvme-dir", required_argument, NULL, OPT_NVME_DIR },
	{ "nvme", required_argument, NULL, OPT_NVME },
	{ "tokens-per-block", required_argument, NULL, OPT_TPB },
	{ "kv-dtype", required_argument, NULL, OPT_DTYPE },
	{ "reference", no_argument, NULL, OPT_REFERENCE },
	{ "prefix-share", no_argument, NULL, OPT_PREFIX_SHARE },
	{ "emu-delay-us", required_argument, NULL, OPT_EMU_DELAY },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "stats-json", required_argument, NULL, OPT_STATS },
	{ "metrics", required_argument, NULL, OPT_METRICS },
	{ "prefetch", no_argument, NULL, OPT_PREFETCH },
	{ "emu-bandwidth", required_argument, NULL, OPT_BANDWIDTH },
	{ "remote", required_argument, NULL, OPT_REMOTE },
	{ "remote-user", required_argument, NULL, OPT_REMOTE_USER },
	{ "remote-password", required_argument, NULL, OPT_REMOTE_PASSWORD },
	{ "remote-save", required_argument, NULL, OPT_REMOTE_SAVE },
	{ "remote-resume", required_argument, NULL, OPT_REMOTE_RESUME },
	{ "help", no_argument, NULL, OPT_HELP },
	{ NULL, 0, NULL, 0 },
};

static int
main_parse_dtype(const char *s, enum kvt_dtype *out)
{
	if (strcmp(s, "f32") == 0)
		*out = KVT_DTYPE_F32;
	else if (strcmp(s, "f16") == 0)
		*out = KVT_DTYPE_F16;
	else if (strcmp(s, "bf16") == 0)
		*out = KVT_DTYPE_BF16;
	else
		return kvtr_err(-EINVAL, "--kv-dtype: '%s' is not f32, f16 or bf16", s);
	return 0;
}

/* --remote HOST:PORT */
static int
main_parse_remote(const char *s, struct kvtr_run_opts *o)
{
	static char host[256];
	const char *colon = strrchr(s, ':');
	uint32_t port = 0;
	int rc;

	if (!colon || colon == s || (size_t)(colon - s) >= sizeof host)
		return kvtr_err(-EINVAL, "--remote: '%s' is not HOST:PORT", s);
	rc = kvtr_parse_u32("--remote port", colon + 1, 1, 65535, &port);
	if (rc)
		return rc;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	o->remote_host = host;
	o->remote_port = (uint16_t)port;
	return 0;
}

static int
main_parse_device(const char *s, enum kvt_device_kind *out)
{
	if (strcmp(s, "emu") == 0 || strcmp(s, "emulated") == 0)
		*out = KVT_DEVICE_EMULATED;
	else if (strcmp(s, "cuda") == 0)
		*out = KVT_DEVICE_CUDA;
	else
		return kvtr_err(-EINVAL, "--device: '%s' is not emu or cuda", s);
	return 0;
}

/* One option; returns 0, 1 for --help, or a negative code. */
static int
main_parse_one(int opt, const char *arg, struct kvtr_run_opts *o, struct main_args *a)
{
	switch (opt) {
	case OPT_MODEL: a->model = arg; return 0;
	case OPT_TOKENIZER: a->tokenizer = arg; return 0;
	case OPT_PROMPT: o->prompt = arg; return 0;
	case OPT_STEPS: return kvtr_parse_u32("--steps", arg, 0, 1u << 22, &o->steps);
	case OPT_TEMP: return kvtr_parse_float("--temperature", arg, 0.0f, 1000.0f,
					       &o->temperature);
	case OPT_TOPP: return kvtr_parse_float("--topp", arg, 0.0f, 1.0f, &o->topp);
	case OPT_SEED:
		a->seed_given = 1;
		return kvtr_parse_u64("--seed", arg, 0, UINT64_MAX, &a->seed);
	case OPT_SESSIONS: return kvtr_parse_u32("--sessions", arg, 1, KVTR_MAX_SESSIONS,
						 &o->sessions);
	case OPT_TURNS: return kvtr_parse_u32("--turns", arg, 1, KVTR_MAX_TURNS, &o->turns);
	case OPT_HBM: return kvtr_parse_size("--hbm", arg, &o->hbm_bytes);
	case OPT_HOST: return kvtr_parse_size("--host", arg, &o->host_bytes);
	case OPT_NVME_DIR: o->nvme_dir = arg; return 0;
	case OPT_NVME: return kvtr_parse_size("--nvme", arg, &o->nvme_bytes);
	case OPT_TPB: return kvtr_parse_u32("--tokens-per-block", arg, 1, 65536,
					    &o->tokens_per_block);
	case OPT_DTYPE: return main_parse_dtype(arg, &o->kv_dtype);
	case OPT_REFERENCE: o->reference = 1; return 0;
	case OPT_PREFIX_SHARE: o->prefix_share = 1; return 0;
	case OPT_EMU_DELAY: return kvtr_parse_u32("--emu-delay-us", arg, 0, 1000000,
						  &o->emu_delay_us);
	case OPT_STATS: a->stats_json = arg; return 0;
	case OPT_METRICS: a->metrics = arg; return 0;
	case OPT_DEVICE: return main_parse_device(arg, &o->device);
	case OPT_PREFETCH: o->prefetch = 1; return 0;
	case OPT_REMOTE: return main_parse_remote(arg, o);
	case OPT_REMOTE_USER: o->remote_user = arg; return 0;
	case OPT_REMOTE_PASSWORD: o->remote_password = arg; return 0;
	case OPT_REMOTE_SAVE: return kvtr_parse_u32("--remote-save", arg, 1, KVTR_MAX_TURNS,
						    &o->remote_save);
	case OPT_REMOTE_RESUME: return kvtr_parse_u32("--remote-resume", arg, 1, KVTR_MAX_TURNS,
						      &o->remote_resume);
	case OPT_BANDWIDTH:
		return kvtr_parse_size("--emu-bandwidth", arg, &o->emu_copy_bytes_per_s);
	case OPT_HELP:
	case 'h':
		return 1;
	default: return kvtr_err(-EINVAL, "unknown option (see --help)");
	}
}

/* The message of a '?' from getopt_long: an unknown or ambiguous option, a value missing or
 * given to an option that takes none. */
static int
main_parse_bad(char **argv)
{
	const char *arg = argv[optind - 1];
	size_t len = strcspn(arg, "=");
	int matches = 0;

	for (const struct option *p = main_opts; p->name; p++)
		if (optopt == p->val)
			return kvtr_err(-EINVAL, p->has_arg == required_argument
					? "option --%s needs a value (see --help)"
					: "option --%s takes no value (see --help)", p->name);
	if (optopt)
		return kvtr_err(-EINVAL, "unknown option -%c (see --help)", optopt);
	if (strncmp(arg, "--", 2) == 0)
		for (const struct option *p = main_opts; p->name; p++)
			matches += strncmp(p->name, arg + 2, len - 2) == 0;
	if (matches > 1)
		return kvtr_err(-EINVAL, "ambiguous option %.*s (see --help)", (int)len, arg);
	return kvtr_err(-EINVAL, "unknown option %.*s (see --help)", (int)len, arg);
}

static int
main_parse(int argc, char **argv, struct kvtr_run_opts *o, struct main_args *a)
{
	int opt, rc;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "h", main_opts, NULL)) != -1) {
		if (opt == '?')
			return main_parse_bad(argv);
		rc = main_parse_one(opt, optarg, o, a);
		if (rc)
			return rc;
	}
	if (optind < argc)
		return kvtr_err(-EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
	if (a->model && !a->tokenizer)
		return kvtr_err(-EINVAL, "--model needs --tokenizer (the built-in tokenizer only "
				"fits the built-in model)");
	return 0;
}

static int
main_load(const struct main_args *a, struct kvtr_model *m, struct kvtr_tokenizer *t)
{
	int rc = a->model ? kvtr_model_load(a->model, m) : kvtr_model_builtin(m);

	if (rc)
		return rc;
	/* main_parse made sure a model file comes with its tokenizer */
	if (a->tokenizer)
		return kvtr_tokenizer_load(a->tokenizer, m->cfg.vocab_size, t);
	return kvtr_tokenizer_builtin(t);
}

/* The seed of session 0: --seed; else llama2.c's clock with --model, a fixed one without. */
static uint64_t
main_seed(const struct main_args *a)
{
	if (a->seed)
		return a->seed;
	if (!a->model && !a->seed_given)
		return MAIN_BUILTIN_SEED;
	return (uint64_t)(unsigned int)time(NULL) | 1; /* llama2.c: 0 = the clock; never 0 */
}

/* Opens output file @path of option @opt before the run, so that an unwritable path fails
 * before decoding; an existing file is not truncated yet (main_out_begin does, on success).
 * *@created: 1 when the file did not exist. Returns 0 or -errno with kvtr_last_error(). */
static int
main_out_open(const char *opt, const char *path, FILE **f, int *created)
{
	struct stat st;
	int fd, err;

	*created = stat(path, &st) != 0;
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	*f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!*f) {
		err = errno;
		if (fd >= 0)
			close(fd);
		return kvtr_err(-err, "%s: cannot write %s: %s", opt, path, strerror(err));
	}
	return 0;
}

/* The run succeeded: empty the output file opened by main_out_open before writing it (a regular
 * file only: /dev/stdout, a pipe or a tty are written as they are). */
static int
main_out_begin(FILE *f, const char *path)
{
	struct stat st;

	if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode))
		return 0;
	if (ftruncate(fileno(f), 0) != 0)
		return kvtr_err(-errno, "cannot write %s: %s", path, strerror(errno));
	return 0;
}

/* Closes an output file; after a failed run (@rc != 0) removes it if this run created it (an
 * earlier file keeps its content). Returns @rc or the close's error. */
static int
main_out_close(FILE **f, const char *path, int created, int rc)
{
	if (!*f)
		return rc;
	if (fclose(*f) != 0 && rc == 0)
		rc = kvtr_err(-EIO, "cannot write %s: %s", path, strerror(errno));
	*f = NULL;
	if (rc && created)
		unlink(path);
	return rc;
}

/* Opens --stats-json and --metrics (unless "-") before the run. 0 or a negative code. */
static int
main_outs_open(struct main_args *a)
{
	int rc = 0;

	if (a->stats_json)
		rc = main_out_open("--stats-json", a->stats_json, &a->stats, &a->stats_created);
	if (rc == 0 && a->metrics && strcmp(a->metrics, "-") != 0)
		rc = main_out_open("--metrics", a->metrics, &a->metrics_f, &a->metrics_created);
	if (rc)
		main_out_close(&a->stats, a->stats_json, a->stats_created, rc);
	return rc;
}

/* Writes the stats file after a successful run (@rc == 0) and closes both output files.
 * Returns @rc or the write's error. */
static int
main_outs_close(struct main_args *a, const struct kvtr_run_opts *o,
		const struct kvtr_run_result *r, int rc)
{
	if (a->stats && rc == 0)
		rc = main_out_begin(a->stats, a->stats_json);
	if (a->stats && rc == 0)
		rc = kvtr_stats_json_write(a->stats, a->stats_json, o, r);
	rc = main_out_close(&a->stats, a->stats_json, a->stats_created, rc);
	return main_out_close(&a->metrics_f, a->metrics, a->metrics_created, rc);
}

/* --metrics: the run's final counters in the Prometheus text format, to stdout or the file
 * main_outs_open opened (closed by main_outs_close). */
static int
main_metrics_write(const struct main_args *a, const struct kvtr_run_result *r)
{
	struct kvt_stats st = r->stats;
	size_t need = 0, len = 0;
	char *buf;
	FILE *f;
	int rc;

	if (!a->metrics)
		return 0;
	st.size = sizeof st; /* zero after a reference run */
	rc = kvt_stats_metrics_text(&st, NULL, 0, &need);
	if (rc != -ENOSPC)
		return kvtr_err_kvt(rc, "--metrics");
	buf = malloc(need);
	if (!buf)
		return kvtr_err(-ENOMEM, "--metrics: out of memory");
	rc = kvt_stats_metrics_text(&st, buf, need, &len);
	if (rc) {
		free(buf);
		return kvtr_err_kvt(rc, "--metrics");
	}
	f = a->metrics_f ? a->metrics_f : stdout;
	rc = f != stdout ? main_out_begin(f, a->metrics) : 0;
	if (rc == 0)
		rc = fwrite(buf, 1, len, f) == len && fflush(f) == 0 ? 0 : -EIO;
	free(buf);
	if (rc)
		return kvtr_err(rc, "--metrics: cannot write %s", a->metrics);
	return 0;
}

static void
main_print_turns(const struct kvtr_run_result *r)
{
	for (uint32_t s = 0; s < r->sessions; s++)
		for (uint32_t t = 0; t < r->turns; t++)
			if (r->out[(size_t)s * r->turns + t].text) /* not run here (--remote-*) */
				printf("[session %u turn %u] %s\n", s + 1, t + 1,
				       r->out[(size_t)s * r->turns + t].text);
}

/* The text went to stdout: a write error (disk full, closed pipe) fails the run. */
static int
main_check_stdout(int rc)
{
	int err = 0;

	if (fflush(stdout) != 0)
		err = errno;
	if ((err || ferror(stdout)) && rc == 0)
		rc = kvtr_err(-EIO, "cannot write the text to stdout: %s",
			      err ? strerror(err) : "write error");
	return rc;
}

/* Loads, runs and reports; returns 0 or a negative code (message in kvtr_last_error). */
static int
main_run(struct main_args *a, struct kvtr_run_opts *o, struct kvtr_run_result *r)
{
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	int rc, single = o->sessions == 1 && o->turns == 1;

	memset(&m, 0, sizeof(m));
	memset(&t, 0, sizeof(t));
	o->seed = main_seed(a);
	rc = main_load(a, &m, &t);
	if (rc == 0) {
		o->model = &m;
		o->tok = &t;
		o->stream = single ? stdout : NULL;
		o->log = stderr;
		if (o->steps > (uint32_t)m.cfg.seq_len)
			fprintf(stderr, "kvtier-run: warning: --steps %u is more than the model's "
				"seq_len %d: capped at %d\n", o->steps, m.cfg.seq_len, m.cfg.seq_len);
		rc = kvtr_run(o, r);
		if (rc == 0 && !single)
			main_print_turns(r);
		if (rc == 0)
			rc = main_metrics_write(a, r);
		rc = main_check_stdout(rc);
		if (rc == 0)
			kvtr_summary_write(stderr, r, !a->model);
		if (rc == 0 && r->positions > 1)
			fprintf(stderr, "achieved tok/s: %f\n", r->tok_per_s);
	}
	rc = main_outs_close(a, o, r, rc);
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
	return rc;
}

int
main(int argc, char **argv)
{
	struct kvtr_run_opts o;
	struct kvtr_run_result r;
	struct main_args a;
	int rc;

	memset(&a, 0, sizeof(a));
	memset(&r, 0, sizeof(r));
	kvtr_run_opts_init(&o);
	rc = main_parse(argc, argv, &o, &a);
	if (rc == 1) {
		main_usage(stdout);
		rc = main_check_stdout(0);
		if (rc)
			fprintf(stderr, "kvtier-run: %s\n", kvtr_last_error());
		return rc ? 1 : 0;
	}
	if (rc == 0)
		rc = main_outs_open(&a);
	if (rc) {
		fprintf(stderr, "kvtier-run: %s\n", kvtr_last_error());
		return 2;
	}
	rc = main_run(&a, &o, &r);
	if (rc)
		fprintf(stderr, "kvtier-run: %s\n", kvtr_last_error());
	kvtr_run_result_free(&r);
	return rc ? 1 : 0;
}
