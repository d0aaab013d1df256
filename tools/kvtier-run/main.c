/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/main.c - command line of kvtier-run, the reference decode runner: it loads a
 * llama2.c model and tokenizer (or the built-in ones), runs the sessions through kvtier (see
 * runner.h) and prints the text as llama2.c does. Only argument handling lives here.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "runner.h"
#include "tokenizer.h"
#include "util.h"

struct main_args {
	const char *model;      /* --model, NULL = built-in */
	const char *tokenizer;  /* --tokenizer, NULL = built-in */
	const char *stats_json; /* --stats-json */
	uint64_t seed;          /* --seed, 0 = time */
};

static void
main_usage(FILE *f)
{
	fputs("usage: kvtier-run [options]\n"
	      "Decode a llama2.c model on the CPU with its KV cache in kvtier (HBM/host/NVMe).\n"
	      "Without --model it runs a built-in model and tokenizer (gibberish, deterministic).\n"
	      "  --model F             llama2.c checkpoint (e.g. stories260K.bin)\n"
	      "  --tokenizer F         llama2.c tokenizer.bin (default: built-in, 512 tokens)\n"
	      "  --prompt S            prompt of every turn (default: built-in prompts; the first\n"
	      "                        turn of session 1 is empty, as llama2.c's default)\n"
	      "  --steps N             positions per turn, prompt included (default 256;\n"
	      "                        0 = seq_len)\n"
	      "  --temperature T       0 = greedy (default 1.0)\n"
	      "  --topp P              top-p in (0,1); other values: plain sampling (default 0.9)\n"
	      "  --seed S              rng seed (default: time); session i uses S + i\n"
	      "  --sessions N          concurrent chat sessions (default 1)\n"
	      "  --turns T             turns per session; sessions are parked between turns\n"
	      "  --hbm SIZE            HBM tier bytes (K/M/G suffixes; default: room for all)\n"
	      "  --host SIZE           pinned host tier bytes (default: room for all)\n"
	      "  --nvme-dir D          directory of the NVMe tier (default: a temp dir)\n"
	      "  --nvme SIZE           NVMe tier bytes (default: room for all)\n"
	      "  --tokens-per-block B  tokens per KV block (default 16)\n"
	      "  --kv-dtype T          f32 (default), f16 or bf16\n"
	      "  --reference           contiguous KV cache, no kvtier (the comparison baseline)\n"
	      "  --emu-delay-us N      emulated device: delay/reorder copies up to N us\n"
	      "  --stats-json F        write tier/transfer statistics as JSON to F\n"
	      "  --help                this text\n"
	      "With one session and one turn stdout is only the generated text, as llama2.c\n"
	      "prints it; otherwise each turn's text is printed as \"[session S turn T] text\".\n",
	      f);
}

enum {
	OPT_MODEL = 256, OPT_TOKENIZER, OPT_PROMPT, OPT_STEPS, OPT_TEMP, OPT_TOPP, OPT_SEED,
	OPT_SESSIONS, OPT_TURNS, OPT_HBM, OPT_HOST, OPT_NVME_DIR, OPT_NVME, OPT_TPB, OPT_DTYPE,
	OPT_REFERENCE, OPT_EMU_DELAY, OPT_STATS, OPT_HELP,
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
	{ "emu-delay-us", required_argument, NULL, OPT_EMU_DELAY },
	{ "stats-json", required_argument, NULL, OPT_STATS },
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
	case OPT_SEED: return kvtr_parse_u64("--seed", arg, 0, UINT64_MAX, &a->seed);
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
	case OPT_EMU_DELAY: return kvtr_parse_u32("--emu-delay-us", arg, 0, 1000000,
						  &o->emu_delay_us);
	case OPT_STATS: a->stats_json = arg; return 0;
	case OPT_HELP: return 1;
	default: return kvtr_err(-EINVAL, "unknown option (see --help)");
	}
}

static int
main_parse(int argc, char **argv, struct kvtr_run_opts *o, struct main_args *a)
{
	int opt, rc;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "", main_opts, NULL)) != -1) {
		if (opt == '?') {
			if (optopt)
				return kvtr_err(-EINVAL, "option %s needs a value (see --help)",
						argv[optind - 1]);
			return kvtr_err(-EINVAL, "unknown option '%s' (see --help)",
					argv[optind - 1]);
		}
		rc = main_parse_one(opt, optarg, o, a);
		if (rc)
			return rc;
	}
	if (optind < argc)
		return kvtr_err(-EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
	return 0;
}

static int
main_load(const struct main_args *a, struct kvtr_model *m, struct kvtr_tokenizer *t)
{
	int rc = a->model ? kvtr_model_load(a->model, m) : kvtr_model_builtin(m);

	if (rc)
		return rc;
	if (a->tokenizer)
		return kvtr_tokenizer_load(a->tokenizer, m->cfg.vocab_size, t);
	rc = kvtr_tokenizer_builtin(t);
	if (rc == 0 && t->vocab_size != m->cfg.vocab_size)
		rc = kvtr_err(KVT_EFORMAT, "the built-in tokenizer has %d tokens but model %s has "
			      "%d: pass --tokenizer", t->vocab_size, m->name, m->cfg.vocab_size);
	return rc;
}

static void
main_print_turns(const struct kvtr_run_result *r)
{
	for (uint32_t s = 0; s < r->sessions; s++)
		for (uint32_t t = 0; t < r->turns; t++)
			printf("[session %u turn %u] %s\n", s + 1, t + 1,
			       r->out[(size_t)s * r->turns + t].text);
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	struct kvtr_run_opts o;
	struct kvtr_run_result r;
	struct main_args a;
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	int rc, single;

	memset(&a, 0, sizeof(a));
	memset(&m, 0, sizeof(m));
	memset(&t, 0, sizeof(t));
	memset(&r, 0, sizeof(r));
	kvtr_run_opts_init(&o);
	rc = main_parse(argc, argv, &o, &a);
	if (rc == 1) {
		main_usage(stdout);
		return 0;
	}
	if (rc) {
		fprintf(stderr, "kvtier-run: %s\n", kvtr_last_error());
		return 2;
	}
	/* llama2.c: seed 0 means "seed from the clock" */
	o.seed = a.seed ? a.seed : (uint64_t)(unsigned int)time(NULL);
	rc = main_load(&a, &m, &t);
	if (rc == 0) {
		single = o.sessions == 1 && o.turns == 1;
		o.model = &m;
		o.tok = &t;
		o.stream = single ? stdout : NULL;
		o.log = stderr;
		rc = kvtr_run(&o, &r);
		if (rc == 0 && !single)
			main_print_turns(&r);
		if (rc == 0 && r.positions > 1)
			fprintf(stderr, "achieved tok/s: %f\n", r.tok_per_s);
		if (rc == 0 && a.stats_json)
			rc = kvtr_stats_json_write(a.stats_json, &o, &r);
	}
	if (rc)
		fprintf(stderr, "kvtier-run: %s\n", kvtr_last_error());
	kvtr_run_result_free(&r);
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
	return rc ? 1 : 0;
}
