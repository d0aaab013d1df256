/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-bench/decode.c - `kvtier-bench decode`: does decode wait for offloaded KV?
 *
 * Many sessions of the real model (llama2.c stories260K through tools/kvtier-run's runner) decode
 * together, three ways in one process, on the emulated device with a copy bandwidth limit:
 *   (a) resident   HBM holds every session's KV: no copies at all (the baseline),
 *   (b) offloaded  HBM holds 1/ratio of the final KV (the rest in HOST); each step's groups are
 *                  prepared on demand, so every promotion is waited for,
 *   (c) prefetch   as (b), with schedule hints: while a group computes, the next group's blocks
 *                  are promoted (kvt_engine_hint), layer by layer.
 * Every session is fed a long prompt (one position per step, as the runner does), so all of
 * them run for the whole turn and the KV grows linearly; the figures are taken over the last
 * steps (--measure-from, default the last quarter), where the KV is (3/4 .. 1) x ratio x HBM.
 * Printed per run: step time, coverage (block accesses that found their block in HBM and did
 * not wait / all), stalls, blocks promoted to HBM and blocks accessed per step, batches
 * (prepares) and host-to-device copy groups per step, and the bound: the time the copy
 * bandwidth alone needs for the bytes a step must move, (accesses - HBM blocks) blocks (a step
 * cannot be shorter). Blocks promoted twice before one use are counted by the engine
 * (stats.repromotions) and printed. The ratio (c)/(a) is the price of offloading with
 * prefetch. The three texts must be identical.
 *
 * Default bandwidth: the machine's measured memcpy bandwidth / 4. A PCIe 4.0 x16 link (~25
 * GB/s) is about a quarter of a server's DRAM copy bandwidth (~100 GB/s); keeping that ratio to
 * what this machine's CPU moves makes transfers take realistic time relative to its compute.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "runner.h"
#include "util.h"

#define DEC_RUNS 3
#define DEC_BW_FACTOR 4.0
#define DEC_PROGRESS_S 5.0 /* seconds between two progress lines of a run */

struct dec_args {
	const char *model;          /* --model */
	const char *tokenizer;      /* --tokenizer */
	uint32_t sessions;          /* --sessions */
	uint32_t steps;             /* --steps: positions per session */
	uint32_t tpb;               /* --tokens-per-block */
	uint32_t ratio;             /* --ratio: final KV / HBM */
	uint32_t measure_from;      /* --measure-from: first measured step (1-based) */
	uint64_t bandwidth;         /* --bandwidth bytes/s; 0 = measured memcpy / DEC_BW_FACTOR */
	uint32_t repeat;            /* --repeat: rounds of (a)(b)(c); the fastest of each counts */
	uint32_t emu_lazy;          /* --emu-lazy: kvt_engine_opts.emu_lazy */
};

/* What the step hook saw in the measured steps of one run. */
struct dec_probe {
	uint32_t from;          /* first measured step */
	uint64_t last_step;     /* last step seen */
	double t_from, t_last;  /* clock at step from - 1 (end of it) and at the last step */
	struct kvt_stats s0;    /* counters at step from - 1 */
	struct kvt_stats s1;    /* counters at the last step */
	const char *name;       /* the run, for the progress line */
	uint32_t round, rounds; /* its round (1-based) of --repeat */
	uint32_t steps;         /* --steps */
	double t_print;         /* clock of the last progress line */
};

struct dec_run {
	const char *name;            /* "(a) resident" ... */
	struct kvtr_run_result r;    /* texts and totals */
	struct dec_probe p;          /* measured steps */
};

/* Best of 5 copies of 64 MiB, bytes/s. */
static double
dec_memcpy_bw(void)
{
	size_t len = 64u << 20;
	char *a = malloc(len), *b = malloc(len);
	double best = 0.0;

	if (!a || !b) {
		free(a);
		free(b);
		return 1e9;
	}
	memset(a, 1, len);
	memset(b, 2, len);
	for (int i = 0; i < 5; i++) {
		double t0 = kvtr_now(), dt;

		memcpy(i % 2 ? a : b, i % 2 ? b : a, len);
		dt = kvtr_now() - t0;
		if (dt > 0 && (double)len / dt > best)
			best = (double)len / dt;
	}
	free(a);
	free(b);
	return best;
}

static void
dec_hook(void *arg, struct kvt_engine *e, uint64_t step)
{
	struct dec_probe *p = arg;
	struct kvt_stats *s = step + 1 == p->from ? &p->s0 : &p->s1;
	double now = kvtr_now();

	/* progress on stderr: the first step of every run, then every DEC_PROGRESS_S seconds */
	if (step == 1 || now - p->t_print >= DEC_PROGRESS_S) { /* @step: steps done */
		fprintf(stderr, "kvtier-bench decode: round %u/%u, %s: step %llu/%u\n", p->round,
			p->rounds, p->name, (unsigned long long)step, p->steps);
		p->t_print = now;
	}
	if (step + 1 < p->from)
		return;
	s->size = sizeof(*s);
	if (kvt_engine_stats(e, s) != 0)
		memset(s, 0, sizeof(*s));
	if (step + 1 == p->from) {
		p->t_from = kvtr_now();
	} else {
		p->t_last = kvtr_now();
		p->last_step = step;
	}
}

/* A prompt long enough to keep every session in its prompt for most of the turn. */
static char *
dec_prompt(uint32_t steps)
{
	static const char piece[] = "Once upon a time, there was a little girl named Lily. She "
				    "loved to play in the park with her big red ball. ";
	size_t n = (size_t)steps / 16 + 1, len = n * (sizeof(piece) - 1) + 1;
	char *s = malloc(len);

	if (!s)
		return NULL;
	s[0] = '\0';
	for (size_t i = 0; i < n; i++)
		strcat(s, piece);
	return s;
}

static int
dec_run_one(const struct dec_args *a, struct kvtr_run_opts *o, struct dec_run *run,
	    uint64_t hbm, int prefetch, uint32_t round)
{
	int rc;

	memset(&run->p, 0, sizeof(run->p));
	run->p.from = a->measure_from;
	run->p.name = run->name;
	run->p.round = round;
	run->p.rounds = a->repeat;
	run->p.steps = a->steps;
	o->hbm_bytes = hbm;
	o->prefetch = prefetch;
	o->step_hook = dec_hook;
	o->hook_arg = &run->p;
	rc = kvtr_run(o, &run->r);
	if (rc)
		fprintf(stderr, "kvtier-bench decode: %s: %s\n", run->name, kvtr_last_error());
	else if (run->p.last_step <= a->measure_from)
		rc = kvtr_err(-EINVAL, "the run ended before step %u: lower --measure-from",
			      a->measure_from);
	return rc;
}

static double
dec_step_ms(const struct dec_run *run)
{
	return (run->p.t_last - run->p.t_from) * 1e3 /
	       (double)(run->p.last_step + 1 - run->p.from);
}

/*
 * The bound: time the copy bandwidth alone needs for the bytes a measured step MUST move into
 * HBM, ms. A step accesses acc blocks and HBM holds @hbm of them, so at least acc - hbm blocks
 * come up every step, whatever the policy (0 when everything fits). It does not depend on what
 * the run itself copied: a run that copies more than it must is slower than its bound.
 */
static double
dec_bound_ms(const struct dec_run *run, double bw, uint64_t hbm, uint64_t block)
{
	const struct dec_probe *p = &run->p;
	double n = (double)(p->last_step + 1 - p->from);
	double acc = (double)(p->s1.accesses - p->s0.accesses) / n;
	double need = acc > (double)hbm ? acc - (double)hbm : 0.0;

	return hbm ? need * (double)block / bw * 1e3 : 0.0;
}

static void
dec_print(const struct dec_run *run, double bw, double base, uint64_t hbm, uint64_t block)
{
	const struct dec_probe *p = &run->p;
	const struct kvt_stats *s0 = &p->s0, *s1 = &p->s1;
	double n = (double)(p->last_step + 1 - p->from);
	double step_ms = (p->t_last - p->t_from) * 1e3 / n;
	uint64_t acc = s1->accesses - s0->accesses, ready = s1->accesses_ready - s0->accesses_ready;
	uint64_t h2d = s1->blocks_moved[KVT_MOVE_HOST_TO_HBM] -
		       s0->blocks_moved[KVT_MOVE_HOST_TO_HBM];
	double bound_ms = dec_bound_ms(run, bw, hbm, block);

	printf("%-14s %9.3f %8.2f%% %9.1f %9.3f %9.1f %9.1f %7.2f %7.2f %9.3f %7.3f\n",
	       run->name, step_ms, acc ? 100.0 * (double)ready / (double)acc : 100.0,
	       (double)(s1->stalls - s0->stalls) / n,
	       (double)(s1->stall_ns - s0->stall_ns) / n / 1e6, (double)h2d / n,
	       (double)acc / n, (double)(s1->batches - s0->batches) / n,
	       (double)(s1->h2d_groups - s0->h2d_groups) / n, bound_ms,
	       base > 0 ? step_ms / base : 1.0);
}


static int
dec_same_text(const struct kvtr_run_result *x, const struct kvtr_run_result *y)
{
	for (size_t i = 0; i < (size_t)x->sessions * x->turns; i++)
		if (x->out[i].n_tokens != y->out[i].n_tokens ||
		    memcmp(x->out[i].tokens, y->out[i].tokens, x->out[i].n_tokens * 4) != 0)
			return 0;
	return 1;
}

static void
dec_summary(const struct dec_run *runs, double bw, int same, uint64_t hbm, uint64_t block)
{
	double a = dec_step_ms(&runs[0]), b = dec_step_ms(&runs[1]), c = dec_step_ms(&runs[2]);
	double bound = dec_bound_ms(&runs[2], bw, hbm, block), floor = a > bound ? a : bound;

	printf("(b)/(a) = %.3f, (c)/(a) = %.3f; the copy bandwidth %s the bytes a step must move "
	       "((accesses - HBM blocks) per step: %.3f ms of copies vs %.3f ms of compute): "
	       "(c)/max((a), bound) = %.3f\n", b / a, c / a,
	       bound <= a ? "covers" : "does not cover", bound, a, c / floor);
	printf("texts of (a), (b), (c) identical: %s\n", same ? "yes" : "NO");
	for (int i = 1; i < DEC_RUNS; i++) {
		const struct kvt_stats *s0 = &runs[i].p.s0, *s1 = &runs[i].p.s1;
		uint64_t h = s1->blocks_moved[KVT_MOVE_HOST_TO_HBM] -
			     s0->blocks_moved[KVT_MOVE_HOST_TO_HBM];
		uint64_t acc = s1->accesses - s0->accesses;
		uint64_t twice = s1->repromotions - s0->repromotions;

		/* stats.repromotions: a promotion of a block whose previous promotion no batch
		 * has used yet (a per-block mark set by a promotion, cleared by an access) */
		printf("%s: %llu blocks promoted to HBM for %llu block accesses; promoted twice "
		       "before one use: %llu%s\n", runs[i].name, (unsigned long long)h,
		       (unsigned long long)acc, (unsigned long long)twice,
		       twice ? "" : " (no block promoted twice for one step)");
	}
}

static int
dec_bench(const struct dec_args *a, const struct kvtr_model *m, const struct kvtr_tokenizer *t)
{
	struct dec_run runs[DEC_RUNS] = { { .name = "(a) resident" }, { .name = "(b) offloaded" },
					  { .name = "(c) prefetch" } };
	double bw = a->bandwidth ? (double)a->bandwidth : dec_memcpy_bw() / DEC_BW_FACTOR;
	uint64_t block = (uint64_t)a->tpb * (uint64_t)m->cfg.n_layers * 2 * m->kv_dim * 4;
	uint64_t kv_blocks = (uint64_t)a->sessions * ((a->steps + a->tpb - 1) / a->tpb);
	uint64_t hbm_blocks = kv_blocks / a->ratio;
	struct kvtr_run_opts o;
	char *prompt = dec_prompt(a->steps);
	int rc = 0, same;

	if (!prompt)
		return kvtr_err(-ENOMEM, "prompt");
	kvtr_run_opts_init(&o);
	o.model = m;
	o.tok = t;
	o.prompt = prompt;
	o.steps = a->steps;
	o.sessions = a->sessions;
	o.tokens_per_block = a->tpb;
	o.emu_copy_bytes_per_s = (uint64_t)bw;
	o.emu_lazy = a->emu_lazy;
	/* the prompt is cut to the turn on purpose (every session stays in it): no warnings */
	o.log = fopen("/dev/null", "w");
	if (!o.log)
		o.log = stderr;
	printf("kvtier-bench decode: %s, %u sessions x %u positions, %u tokens/block (%llu bytes), "
	       "final KV %llu blocks, HBM %llu blocks (1/%u) for (b) and (c)\n", m->name,
	       a->sessions, a->steps, a->tpb, (unsigned long long)block,
	       (unsigned long long)kv_blocks, (unsigned long long)hbm_blocks, a->ratio);
	printf("emulated copy bandwidth %.2f GB/s%s; measured steps %u..%u (KV %.1fx..%.1fx HBM); "
	       "fastest of %u rounds%s\n", bw / 1e9, a->bandwidth ? "" : " (memcpy / 4)",
	       a->measure_from, a->steps, (double)a->measure_from / a->steps * a->ratio,
	       (double)a->ratio, a->repeat, a->emu_lazy ? "; lazy emulated streams" : "");
	/* rounds interleave the three, so a burst of load on a shared machine hits all alike; the
	 * fastest round of each is kept (its counters with it) */
	for (uint32_t k = 0; k < a->repeat && rc == 0; k++) {
		for (int i = 0; i < DEC_RUNS && rc == 0; i++) {
			struct dec_run cur = { .name = runs[i].name };

			rc = dec_run_one(a, &o, &cur, i == 0 ? 0 : hbm_blocks * block, i == 2,
					 k + 1);
			if (rc == 0 && (k == 0 || dec_step_ms(&cur) < dec_step_ms(&runs[i]))) {
				kvtr_run_result_free(&runs[i].r);
				runs[i] = cur;
			} else {
				kvtr_run_result_free(&cur.r);
			}
		}
	}
	if (rc == 0) {
		printf("%-14s %9s %9s %9s %9s %9s %9s %7s %7s %9s %7s\n", "run", "step_ms",
		       "coverage", "stalls/st", "stall_ms", "h2d/step", "acc/step", "bat/st",
		       "grp/st", "bound_ms", "vs_(a)");
		for (int i = 0; i < DEC_RUNS; i++)
			dec_print(&runs[i], bw, dec_step_ms(&runs[0]), i ? hbm_blocks : 0, block);
		same = dec_same_text(&runs[0].r, &runs[1].r) &&
		       dec_same_text(&runs[0].r, &runs[2].r);
		dec_summary(runs, bw, same, hbm_blocks, block);
		if (!same)
			rc = kvtr_err(-EPROTO, "the three runs produced different texts");
	}
	for (int i = 0; i < DEC_RUNS; i++)
		kvtr_run_result_free(&runs[i].r);
	if (o.log != stderr)
		fclose(o.log);
	free(prompt);
	return rc;
}

static void
dec_usage(FILE *f)
{
	fputs("usage: kvtier-bench decode [options]\n"
	      "  --model F             llama2.c checkpoint (default\n"
	      "                        ../shared/data/models/stories260K.bin)\n"
	      "  --tokenizer F         its tokenizer (default ../shared/data/models/tok512.bin)\n"
	      "  --sessions N          sessions decoding together (default 32)\n"
	      "  --steps N             positions per session (default 256)\n"
	      "  --tokens-per-block B  tokens per block (default 16)\n"
	      "  --ratio R             final KV / HBM for runs (b) and (c) (default 4)\n"
	      "  --measure-from S      first measured step (default: 3/4 of --steps)\n"
	      "  --repeat N            rounds of the three runs; the fastest of each counts\n"
	      "                        (default 3)\n"
	      "  --bandwidth B         emulated copy bytes/s, K/M/G/T suffixes (default: measured\n"
	      "                        memcpy bandwidth / 4, a PCIe-to-DRAM-like ratio)\n"
	      "  --emu-lazy            (no value) the emulated device's lazy streams: a copy runs\n"
	      "                        on the thread that observes it, after the same link time,\n"
	      "                        not on a stream thread woken per submit (docs/PERF.md\n"
	      "                        \"Lazy emulated streams\")\n"
	      "Progress on stderr: \"round R/N, RUN: step S/STEPS\" at the start of each run and\n"
	      "every 5 s. The default (32 sessions x 256 positions, 3 rounds of 3 runs) takes\n"
	      "2-3 minutes on a 2-core machine; --repeat 1 a third of that (README).\n"
	      "Exit status: 0 done; 2 usage error (bad option or value); 1 the run failed.\n",
	      f);
}

/* Is @k one of decode's options that take a value (--emu-lazy, a flag, is handled before)? */
static bool
dec_known(const char *k)
{
	static const char *const names[] = { "--model", "--tokenizer", "--sessions", "--steps",
					      "--tokens-per-block", "--ratio", "--measure-from",
					      "--repeat", "--bandwidth" };

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(k, names[i]))
			return true;
	return false;
}

static int
dec_parse(int argc, char **argv, struct dec_args *a)
{
	for (int i = 1; i < argc; i++) {
		const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc;

		if (!strcmp(k, "-h") || !strcmp(k, "--help"))
			return 1;
		if (!strcmp(k, "--emu-lazy")) {
			a->emu_lazy = 1;
			continue;
		}
		if (!dec_known(k))
			return kvtr_err(-EINVAL, "unknown option %s (see --help)", k);
		if (!v)
			return kvtr_err(-EINVAL, "%s: missing value (see --help)", k);
		i++;
		if (!strcmp(k, "--model"))
			a->model = v, rc = 0;
		else if (!strcmp(k, "--tokenizer"))
			a->tokenizer = v, rc = 0;
		else if (!strcmp(k, "--sessions"))
			rc = kvtr_parse_u32(k, v, 1, KVTR_MAX_SESSIONS, &a->sessions);
		else if (!strcmp(k, "--steps"))
			rc = kvtr_parse_u32(k, v, 8, 1u << 20, &a->steps);
		else if (!strcmp(k, "--tokens-per-block"))
			rc = kvtr_parse_u32(k, v, 1, 65536, &a->tpb);
		else if (!strcmp(k, "--ratio"))
			rc = kvtr_parse_u32(k, v, 1, 1024, &a->ratio);
		else if (!strcmp(k, "--measure-from"))
			rc = kvtr_parse_u32(k, v, 1, 1u << 20, &a->measure_from);
		else if (!strcmp(k, "--repeat"))
			rc = kvtr_parse_u32(k, v, 1, 100, &a->repeat);
		else if (!strcmp(k, "--bandwidth"))
			rc = kvtr_parse_size(k, v, &a->bandwidth);
		else
			rc = kvtr_err(-EINVAL, "unknown option %s (see --help)", k);
		if (rc)
			return rc;
	}
	if (!a->measure_from)
		a->measure_from = a->steps - a->steps / 4;
	if (a->measure_from >= a->steps)
		return kvtr_err(-EINVAL, "--measure-from %u must be below --steps %u",
				a->measure_from, a->steps);
	return 0;
}

int
kvtb_decode_main(int argc, char **argv)
{
	struct dec_args a = { .model = "../shared/data/models/stories260K.bin",
			      .tokenizer = "../shared/data/models/tok512.bin", .sessions = 32,
			      .steps = 256, .tpb = 16, .ratio = 4, .repeat = 3 };
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	int rc, usage = 0;

	memset(&m, 0, sizeof(m));
	memset(&t, 0, sizeof(t));
	rc = dec_parse(argc, argv, &a);
	if (rc == 1) {
		dec_usage(stdout);
		return 0;
	}
	usage = rc != 0;
	if (rc == 0)
		rc = kvtr_model_load(a.model, &m);
	if (rc == 0)
		rc = kvtr_tokenizer_load(a.tokenizer, m.cfg.vocab_size, &t);
	if (rc == 0 && a.steps > (uint32_t)m.cfg.seq_len) {
		rc = kvtr_err(-EINVAL, "--steps %u exceeds the model's seq_len %d", a.steps,
			      m.cfg.seq_len);
		usage = 1;
	}
	if (rc == 0)
		rc = dec_bench(&a, &m, &t);
	if (rc)
		fprintf(stderr, "kvtier-bench decode: %s\n", kvtr_last_error());
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
	return usage ? 2 : rc ? 1 : 0; /* as every kvtier-bench mode: usage 2, failure 1 */
}
