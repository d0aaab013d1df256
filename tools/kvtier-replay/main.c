/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/main.c - replay a serving trace against kvtier's eviction policies.
 *
 *   kvtier-replay TRACE [options]
 *
 * Metadata-only: no bytes move; kvtier's own evict/ policies rank the blocks. Two parts:
 *   - a sweep of single-tier capacities (default 1k..64k blocks) for each policy and Belady MIN;
 *   - a tiered run (HBM -> HOST -> NVME) for each policy, and MIN at the combined capacity.
 * Results: a table on stdout, --csv/--json files, --plot PNG (gnuplot). Other modes: --data (a
 * real engine), --nodes (multi.c), --hybrid (checkpoint memory of a STATE group, hybrid.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "out.h"
#include "replay.h"
#include "replay_data.h"
#include "util.h"

#define RP_MAX_CAPS 32
#define RP_MAX_POLS 5 /* policies and MIN */

struct rp_opts {
	const char *trace;            /* trace file */
	uint64_t caps[RP_MAX_CAPS];   /* sweep capacities, blocks */
	size_t n_caps;                /* entries */
	const char *tier_spec[RP_TIERS]; /* --hbm/--host/--nvme as given */
	const char *sweep_spec;       /* --sweep as given */
	const char *pol_spec;         /* --policies as given */
	char pol_buf[64];             /* copy of pol_spec cut into names */
	const char *pols[RP_MAX_POLS]; /* policies */
	size_t n_pols;                /* entries */
	uint64_t bytes_per_token;     /* KV bytes of one token, all layers */
	uint32_t block_tokens;        /* CSV traces: tokens per block */
	uint32_t limit;               /* requests (0 = all) */
	const char *csv, *json, *plot; /* outputs */
	int data;                     /* --data: real bytes through an engine */
	const char *nvme_dir;         /* --nvme-dir for data mode */
	const char *nodes_spec;       /* --nodes LIST: the multi-node runs (multi.c) */
	const char *remote_spec;      /* --remote N|unbounded */
	const char *split_spec;       /* --split conversation|request */
	const char *admit_spec;       /* --admit all|seen-twice */
	const char *budget_spec[2];   /* --write-budget-nvme / --write-budget-remote BYTES/s */
	const char *period_spec;      /* --write-budget-period MS */
	const char *hybrid_model;     /* --hybrid MODEL.json: the checkpoint table (hybrid.c) */
	uint64_t state_bytes;         /* --state-bytes: one checkpoint, bytes (0 = the model's) */
	uint64_t attn_token_bytes;    /* --attn-token-bytes (0 = the model's) */
	uint32_t ckpt_every;          /* --checkpoint-every N: a row besides 1, 4, 16 (0 = none) */
};

static void
rp_usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-replay TRACE [options]\n"
		"  TRACE                 Mooncake JSONL (hash_ids of 512-token blocks) or Azure CSV\n"
		"  --sweep LIST          single-tier capacities, e.g. 1k,4k,16k,64k or 2GiB,8GiB\n"
		"                        (default 1k,2k,4k,8k,16k,32k,64k blocks; k = 1000)\n"
		"  --hbm N --host N --nvme N   tiered run capacities: blocks (4k = 4000 blocks)\n"
		"                        or bytes ending in B (512MiB, 1.5GiB, 2TB: binary)\n"
		"                        (default 2k, 8k, 32k blocks)\n"
		"  --policies LIST       kvtier policies to compare (default lru,arc; also prio,\n"
		"                        clock: GCLOCK, the engine's NVMe policy under lru/arc;\n"
		"                        not an engine option, so data mode skips it)\n"
		"  --bytes-per-token N   KV bytes per token, all layers (default 131072 = 128 KiB:\n"
		"                        Llama-3-8B, 32 layers x 8 KV heads x 128 x K+V x fp16);\n"
		"                        a block is --block-tokens (Mooncake: 512) x this = 64 MiB\n"
		"                        by default: it converts byte capacities to blocks, and\n"
		"                        every GiB column is blocks x that block size\n"
		"  --block-tokens N      tokens per block of CSV traces (default 512)\n"
		"  --limit N             replay the first N requests only (N >= 1)\n"
		"  --csv FILE  --json FILE  --plot FILE.png   outputs\n"
		"  --data                data mode: the tiered run through a real engine (emulated\n"
		"                        device, HOST memory, NVMe file), prefix sharing on, real\n"
		"                        bytes checked on every hit; use --limit for short runs\n"
		"  --nvme-dir D          NVMe file directory of data mode (default /tmp)\n"
		"  --nodes LIST          multi-node runs instead of the sweep: the trace split across\n"
		"                        N nodes (e.g. 1,2,4,8), each with the --hbm/--host/--nvme\n"
		"                        tiers, alone and sharing one REMOTE tier; first policy only\n"
		"  --remote N|unbounded  REMOTE capacity (blocks or bytes as --hbm; LRU like Redis's\n"
		"                        allkeys-lru; default unbounded)\n"
		"  --split conversation|request  node of a request: hash of its conversation key\n"
		"                        (hash_ids[1], the trace has no conversation id; default)\n"
		"                        or of its index (no affinity)\n"
		"  --write-budget-nvme R, --write-budget-remote R   bytes/s (64MiB or 64MiB/s) that\n"
		"                        each node may write to NVMe / the fleet to REMOTE (token\n"
		"                        bucket on trace time, at most 1TiB/s); adds a budgeted run\n"
		"                        per N\n"
		"  --write-budget-period MS  the budget's period: the bucket holds MS ms of budget\n"
		"                        (default 1000; 1..3600000; the Mooncake trace's times come\n"
		"                        in 3 s steps, so a period under 3000 ms forfeits budget)\n"
		"  --admit all|seen-twice  writes to NVMe and REMOTE of every block (default) or only\n"
		"                        of one seen by a second request; adds a budgeted run per N\n"
		"  --hybrid MODEL.json   checkpoint table of a hybrid (linear + full attention) layout\n"
		"                        instead of the sweep: a config.json kvtier-calc reads (e.g.\n"
		"                        tests/data/configs/qwen3-next-80b-a3b.json) gives the state\n"
		"                        of one sequence (one checkpoint) and the attention KV per\n"
		"                        token; unbounded cache, checkpoints every 1, 4, 16 blocks\n"
		"  --state-bytes B, --attn-token-bytes B   the same figures given (or overriding the\n"
		"                        model's); with both, --hybrid is not needed\n"
		"  --checkpoint-every N  one more row of the checkpoint table (N >= 1 blocks)\n"
		"Default: metadata-only, kvtier's own eviction policies, no KV bytes moved.\n"
		"Exit status: 0 done; 2 usage error (bad option or value, output path that cannot\n"
		"be written), before any run; 1 the run failed (trace unreadable or malformed).\n");
}

/* "4096", "4k" (blocks, k = 1000) or bytes in the tools' size syntax ending in B: "2GiB",
 * "1.5GB", "512MiB", "100B" (binary), converted to whole blocks of @block_bytes. */
static int
rp_parse_cap(const char *s, uint64_t block_bytes, uint64_t *out)
{
	size_t len = strlen(s);
	uint64_t v;
	char buf[64];

	if (len && (s[len - 1] == 'B' || s[len - 1] == 'b')) {
		if (kvtr_parse_bytes("capacity", s, 1, UINT64_MAX, &v))
			return -1;
		v /= block_bytes;
	} else if (len && (s[len - 1] == 'k' || s[len - 1] == 'K') && len < sizeof buf) {
		memcpy(buf, s, len - 1);
		buf[len - 1] = '\0';
		if (kvtr_parse_u64("capacity", buf, 0, 4000000, &v))
			return -1;
		v *= 1000;
	} else if (kvtr_parse_u64("capacity", s, 0, 4000000000ull, &v)) {
		return -1;
	}
	if (v >= 4000000000ull)
		return -1;
	*out = v;
	return 0;
}

/* Print the parse error kvtr_last_error() holds; returns -1. */
static int
rp_arg_error(void)
{
	fprintf(stderr, "kvtier-replay: %s\n", kvtr_last_error());
	return -1;
}

static int
rp_parse_args(int argc, char **argv, struct rp_opts *o)
{
	int i;

	memset(o, 0, sizeof *o);
	o->bytes_per_token = 131072;
	o->block_tokens = 512;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			rp_usage(stdout);
			exit(0);
		}
		if (!strcmp(a, "--data")) {
			o->data = 1;
			continue;
		}
		if (a[0] != '-') {
			if (o->trace) {
				fprintf(stderr, "kvtier-replay: one trace only (%s)\n", a);
				return -1;
			}
			o->trace = a;
			continue;
		}
		if (!v) {
			fprintf(stderr, "kvtier-replay: %s needs a value\n", a);
			return -1;
		}
		i++;
		if (!strcmp(a, "--sweep"))
			o->sweep_spec = v;
		else if (!strcmp(a, "--hbm"))
			o->tier_spec[0] = v;
		else if (!strcmp(a, "--host"))
			o->tier_spec[1] = v;
		else if (!strcmp(a, "--nvme"))
			o->tier_spec[2] = v;
		else if (!strcmp(a, "--policies"))
			o->pol_spec = v;
		else if (!strcmp(a, "--bytes-per-token") &&
			 kvtr_parse_bytes(a, v, 1, UINT64_C(1) << 40, &o->bytes_per_token))
			return rp_arg_error();
		else if (!strcmp(a, "--block-tokens") &&
			 kvtr_parse_u32(a, v, 1, 1u << 20, &o->block_tokens))
			return rp_arg_error();
		else if (!strcmp(a, "--limit") && kvtr_parse_u32(a, v, 1, UINT32_MAX, &o->limit))
			return rp_arg_error();
		else if (!strcmp(a, "--state-bytes") &&
			 kvtr_parse_bytes(a, v, 1, UINT64_C(1) << 40, &o->state_bytes))
			return rp_arg_error();
		else if (!strcmp(a, "--attn-token-bytes") &&
			 kvtr_parse_bytes(a, v, 1, UINT64_C(1) << 40, &o->attn_token_bytes))
			return rp_arg_error();
		else if (!strcmp(a, "--checkpoint-every") &&
			 kvtr_parse_u32(a, v, 1, 1u << 20, &o->ckpt_every))
			return rp_arg_error();
		else if (!strcmp(a, "--bytes-per-token") || !strcmp(a, "--block-tokens") ||
			 !strcmp(a, "--limit") || !strcmp(a, "--state-bytes") ||
			 !strcmp(a, "--attn-token-bytes") || !strcmp(a, "--checkpoint-every"))
			continue;
		else if (!strcmp(a, "--hybrid"))
			o->hybrid_model = v;
		else if (!strcmp(a, "--csv"))
			o->csv = v;
		else if (!strcmp(a, "--json"))
			o->json = v;
		else if (!strcmp(a, "--plot"))
			o->plot = v;
		else if (!strcmp(a, "--nvme-dir"))
			o->nvme_dir = v;
		else if (!strcmp(a, "--nodes"))
			o->nodes_spec = v;
		else if (!strcmp(a, "--remote"))
			o->remote_spec = v;
		else if (!strcmp(a, "--split"))
			o->split_spec = v;
		else if (!strcmp(a, "--admit"))
			o->admit_spec = v;
		else if (!strcmp(a, "--write-budget-nvme"))
			o->budget_spec[0] = v;
		else if (!strcmp(a, "--write-budget-remote"))
			o->budget_spec[1] = v;
		else if (!strcmp(a, "--write-budget-period"))
			o->period_spec = v;
		else {
			fprintf(stderr, "kvtier-replay: unknown option %s (see --help)\n", a);
			return -1;
		}
	}
	if (!o->trace) {
		rp_usage(stderr);
		return -1;
	}
	if (!o->nodes_spec && (o->remote_spec || o->split_spec || o->admit_spec ||
			       o->budget_spec[0] || o->budget_spec[1] || o->period_spec)) {
		fprintf(stderr, "kvtier-replay: --remote, --split, --admit and --write-budget-* "
			"apply to the multi-node runs: give --nodes too\n");
		return -1;
	}
	if (!o->hybrid_model && (o->state_bytes || o->attn_token_bytes || o->ckpt_every) &&
	    (!o->state_bytes || !o->attn_token_bytes)) {
		fprintf(stderr, "kvtier-replay: the checkpoint table needs --hybrid MODEL.json or "
			"both --state-bytes and --attn-token-bytes\n");
		return -1;
	}
	if (!o->bytes_per_token || !o->block_tokens) {
		fprintf(stderr, "kvtier-replay: --bytes-per-token and --block-tokens must be > 0\n");
		return -1;
	}
	return 0;
}

/* Is the comma list @spec of option @opt free of empty elements ("1k,,2k", ",1k", "1k,")?
 * 0, or -1 with a message. */
static int
rp_list_ok(const char *opt, const char *spec)
{
	size_t len = strlen(spec);

	if (len == 0 || spec[0] == ',' || spec[len - 1] == ',' || strstr(spec, ",,")) {
		fprintf(stderr, "kvtier-replay: %s: empty element in '%s' (give a comma-separated "
			"list without empty entries)\n", opt, spec);
		return -1;
	}
	return 0;
}

/* Cut @spec at commas into @o->caps (blocks). */
static int
rp_parse_sweep(struct rp_opts *o, const char *spec, uint64_t block_bytes)
{
	char buf[512], *tok, *save = NULL;

	snprintf(buf, sizeof buf, "%s", spec); /* main() refused empty elements */
	o->n_caps = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->n_caps == RP_MAX_CAPS || rp_parse_cap(tok, block_bytes, &o->caps[o->n_caps]) ||
		    !o->caps[o->n_caps]) {
			fprintf(stderr, "kvtier-replay: --sweep: bad or too many capacities at '%s'\n",
				tok);
			return -1;
		}
		o->n_caps++;
	}
	return o->n_caps ? 0 : -1;
}

static int
rp_parse_pols(struct rp_opts *o)
{
	char *tok, *save = NULL;

	if (o->pol_spec && rp_list_ok("--policies", o->pol_spec))
		return -1;
	snprintf(o->pol_buf, sizeof o->pol_buf, "%s", o->pol_spec ? o->pol_spec : "lru,arc");
	o->n_pols = 0;
	for (tok = strtok_r(o->pol_buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->n_pols == RP_MAX_POLS - 1 || !kvt_evict_by_name(tok)) {
			fprintf(stderr, "kvtier-replay: --policies: unknown or too many: '%s' "
				"(lru, prio, arc, clock; at most %d)\n", tok, RP_MAX_POLS - 1);
			return -1;
		}
		o->pols[o->n_pols++] = tok;
	}
	return o->n_pols ? 0 : -1;
}

static void
rp_summary(const struct rp_result *r, size_t n)
{
	const struct rp_result *lru = NULL, *arc = NULL, *min = NULL;
	size_t i;

	for (i = 0; i < n; i++) {
		if (!strcmp(r[i].policy, "lru"))
			lru = &r[i];
		else if (!strcmp(r[i].policy, "arc"))
			arc = &r[i];
		else if (!strcmp(r[i].policy, "min"))
			min = &r[i];
	}
	if (arc && lru && rp_hits(lru))
		printf("  arc/lru %.2fx", (double)rp_hits(arc) / (double)rp_hits(lru));
	if (arc && min && rp_hits(min))
		printf("  arc/min %.2fx", (double)rp_hits(arc) / (double)rp_hits(min));
	printf("  parents dropped before a cached child:");
	for (i = 0; i < n; i++)
		if (strcmp(r[i].policy, "min"))
			printf(" %s %llu", r[i].policy, (unsigned long long)r[i].orphaned);
	printf("\n");
}

static uint32_t
rp_policy_enum(const char *name)
{
	return !strcmp(name, "arc") ? KVT_EVICT_ARC : !strcmp(name, "prio") ? KVT_EVICT_PRIO :
									       KVT_EVICT_LRU;
}

/* Data mode: each policy through a real engine at the tier capacities. */
static int
rp_data_mode(const struct rp_opts *o, const struct rp_trace *tr, const uint64_t tiers[RP_TIERS])
{
	static const char *const mv[KVT_MOVE_COUNT] = { "HBM>HOST", "HOST>NVMe", "NVMe>HOST",
							"HOST>HBM" };
	struct rp_data_opts d = { .nvme_dir = o->nvme_dir ? o->nvme_dir : "/tmp" };
	struct rp_data_result r;
	struct rp_result m;
	size_t p;
	int t, rc = 0;

	memcpy(d.cap, tiers, sizeof d.cap);
	printf("\n== data mode: tiers HBM %llu + HOST %llu + NVME %llu blocks, real engine ==\n",
	       (unsigned long long)tiers[0], (unsigned long long)tiers[1],
	       (unsigned long long)tiers[2]);
	for (p = 0; p < o->n_pols && rc == 0; p++) {
		if (!strcmp(o->pols[p], "clock")) { /* no engine option: its NVMe tier's policy */
			printf("clock not an engine policy (the engine runs it on NVMe under lru and "
			       "arc): skipped\n");
			continue;
		}
		d.policy = rp_policy_enum(o->pols[p]);
		rc = rp_data_run(tr, &d, rp_progress, &r);
		if (rc)
			break;
		printf("%-5s prefix hit %.2f%% of blocks (HBM %llu, HOST %llu, NVMe %llu), %.2f%% "
		       "of tokens; %llu shared blocks read back, %llu mismatched\n", o->pols[p],
		       100.0 * (double)r.st.prefix_hit_blocks / (double)(r.refs ? r.refs : 1),
		       (unsigned long long)r.st.tier[0].prefix_hit_blocks,
		       (unsigned long long)r.st.tier[1].prefix_hit_blocks,
		       (unsigned long long)r.st.tier[2].prefix_hit_blocks,
		       100.0 * (double)r.attached_tokens / (double)(r.tokens ? r.tokens : 1),
		       (unsigned long long)r.verified, (unsigned long long)r.mismatches);
		printf("      evictions HBM %llu HOST %llu NVMe %llu; moved",
		       (unsigned long long)r.st.tier[0].evictions,
		       (unsigned long long)r.st.tier[1].evictions,
		       (unsigned long long)r.st.tier[2].evictions);
		for (t = 0; t < KVT_MOVE_COUNT; t++)
			printf(" %s %.1f MiB", mv[t], (double)r.st.bytes_moved[t] / 1048576.0);
		printf("; prefill tokens saved %llu\n", (unsigned long long)r.attached_tokens);
		if (r.mismatches)
			rc = -EIO;
	}
	if (rc == 0 && rp_min_run(tr, tiers[0] + tiers[1] + tiers[2], NULL, &m) == 0)
		printf("min   (metadata, at the sum) prefix hit %.2f%% of blocks\n",
		       100.0 * (double)rp_hits(&m) / (double)(m.refs ? m.refs : 1));
	return rc;
}

/* A write budget "64MiB", "64MiB/s" or "1000000" (bytes per second). 0 or -1 (message). */
static int
rp_parse_budget(const char *opt, const char *spec, uint64_t *out)
{
	char buf[64];
	size_t len = strlen(spec);

	if (len >= sizeof buf) {
		fprintf(stderr, "kvtier-replay: %s: too long: '%s'\n", opt, spec);
		return -1;
	}
	memcpy(buf, spec, len + 1);
	if (len > 2 && !strcmp(buf + len - 2, "/s"))
		buf[len - 2] = '\0';
	if (kvtr_parse_bytes(opt, buf, 1, UINT64_C(1) << 40, out))
		return rp_arg_error();
	return 0;
}

/* The multi-node options into @m and the node counts into @nodes; 0 or -1 (message). */
static int
rp_parse_nodes(const struct rp_opts *o, uint64_t bb, const uint64_t tiers[RP_TIERS],
	       struct rp_multi_opts *m, uint32_t *nodes, size_t *n_nodes)
{
	char buf[256], *tok, *save = NULL;
	int i;

	memset(m, 0, sizeof *m);
	memcpy(m->cap, tiers, sizeof m->cap);
	m->block_bytes = bb;
	m->remote_cap = RP_UNBOUNDED;
	if (rp_list_ok("--nodes", o->nodes_spec))
		return -1;
	snprintf(buf, sizeof buf, "%s", o->nodes_spec);
	*n_nodes = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (*n_nodes == RP_MAX_CAPS ||
		    kvtr_parse_u32("--nodes", tok, 1, 4096, &nodes[*n_nodes]))
			return *n_nodes == RP_MAX_CAPS ?
				(fprintf(stderr, "kvtier-replay: --nodes: at most %d counts\n",
					 RP_MAX_CAPS), -1) : rp_arg_error();
		(*n_nodes)++;
	}
	if (o->remote_spec && strcmp(o->remote_spec, "unbounded") &&
	    (rp_parse_cap(o->remote_spec, bb, &m->remote_cap) || !m->remote_cap)) {
		fprintf(stderr, "kvtier-replay: --remote: bad capacity '%s' (blocks >= 1, bytes "
			"ending in B, or unbounded)\n", o->remote_spec);
		return -1;
	}
	if (o->split_spec && strcmp(o->split_spec, "conversation")) {
		if (strcmp(o->split_spec, "request")) {
			fprintf(stderr, "kvtier-replay: --split: '%s' is neither conversation nor "
				"request\n", o->split_spec);
			return -1;
		}
		m->split = RP_SPLIT_REQUEST;
	}
	for (i = 0; i < 2; i++)
		if (o->budget_spec[i] &&
		    rp_parse_budget(i ? "--write-budget-remote" : "--write-budget-nvme",
				    o->budget_spec[i], &m->budget[i]))
			return -1;
	if (o->period_spec &&
	    kvtr_parse_u64("--write-budget-period", o->period_spec, 1, 3600000, &m->period_ms))
		return rp_arg_error();
	if (o->admit_spec && strcmp(o->admit_spec, "all")) {
		if (strcmp(o->admit_spec, "seen-twice")) {
			fprintf(stderr, "kvtier-replay: --admit: '%s' is neither all nor "
				"seen-twice\n", o->admit_spec);
			return -1;
		}
		m->admit = RP_ADMIT_SEEN_TWICE;
	}
	return 0;
}

/* Multi-node mode: per node count, the nodes alone, sharing REMOTE, and (with a budget or an
 * admission rule) sharing REMOTE under them; a table each, --json of all. 0 or 1. */
static int
rp_nodes_mode(const struct rp_opts *o, const struct rp_trace *tr, const struct rp_multi_opts *m,
	      const uint32_t *nodes, size_t n_nodes)
{
	static const char *const names[3] = { "alone", "shared", "budget" };
	const struct kvt_evict_ops *ops = kvt_evict_by_name(o->pols[0]);
	bool budget = m->budget[0] || m->budget[1] || m->admit != RP_ADMIT_ALL;
	struct rp_multi_result *res = calloc(n_nodes * 3, sizeof *res); /* [run][node count] */
	const char **run = calloc(n_nodes * 3, sizeof *run);
	struct rp_multi_opts x;
	size_t i, k, n = 0;
	int rc = 1;

	if (!res || !run)
		goto out;
	printf("multi-node: %s local tiers HBM %llu + HOST %llu + NVME %llu blocks per node, "
	       "split by %s, %llu bytes per block\n", ops->name, (unsigned long long)m->cap[0],
	       (unsigned long long)m->cap[1], (unsigned long long)m->cap[2],
	       m->split == RP_SPLIT_REQUEST ? "request" : "conversation (hash_ids[1])",
	       (unsigned long long)m->block_bytes);
	for (k = 0; k < (budget ? 3u : 2u); k++)
		for (i = 0; i < n_nodes; i++) {
			x = *m;
			x.nodes = nodes[i];
			if (k < 2) { /* no budget, every block admitted */
				x.budget[0] = x.budget[1] = 0;
				x.admit = RP_ADMIT_ALL;
			}
			if (k == 0)
				x.remote_cap = 0;
			run[n] = names[k];
			if (rp_multi_run(tr, ops, &x, &res[n++]))
				goto out;
		}
	printf("\n== N nodes alone (remote none) and sharing one REMOTE tier ==\n");
	rp_print_multi(stdout, res, 2 * n_nodes);
	if (budget) {
		printf("\n== write budget: NVMe %llu B/s per node, REMOTE %llu B/s (0 = no budget), "
		       "period %llu ms, admit %s ==\n", (unsigned long long)m->budget[0],
		       (unsigned long long)m->budget[1],
		       (unsigned long long)(m->period_ms ? m->period_ms : 1000),
		       m->admit == RP_ADMIT_SEEN_TWICE ? "seen-twice" : "all");
		rp_print_multi(stdout, &res[2 * n_nodes], n_nodes);
		printf("\n== writes saved against hits lost, relative to the shared run without "
		       "budget ==\n");
		rp_print_budget(stdout, &res[n_nodes], &res[2 * n_nodes], n_nodes);
	}
	rc = o->json && rp_write_multi_json(o->json, res, run, n) ? 1 : 0;
out:
	free(res);
	free(run);
	return rc;
}

/* The checkpoint table of a hybrid layout (hybrid.c): every 1, 4, 16 blocks and
 * --checkpoint-every. 0, 1 (run failed) or 2 (the model could not give the bytes). */
static int
rp_hybrid_mode(const struct rp_opts *o, const struct rp_trace *tr)
{
	struct rp_hybrid_bytes b = { (double)o->state_bytes, (double)o->attn_token_bytes };
	struct rp_hybrid_result res[4];
	uint32_t every[4] = { 1, 4, 16, 0 };
	size_t n = 3, i;

	if (o->hybrid_model && rp_hybrid_from_model(o->hybrid_model, &b))
		return 2;
	if (o->ckpt_every && o->ckpt_every != 1 && o->ckpt_every != 4 && o->ckpt_every != 16)
		every[n++] = o->ckpt_every;
	for (i = 0; i < n; i++)
		if (rp_hybrid_run(tr, every[i], &res[i]))
			return 1;
	printf("hybrid layout%s%s: one checkpoint (state of one sequence) %.0f bytes, attention "
	       "KV %.0f bytes per token (%.1f tokens of it per checkpoint); %u-token blocks, "
	       "unbounded prefix cache\n", o->hybrid_model ? " of " : "",
	       o->hybrid_model ? o->hybrid_model : "", b.state_bytes, b.attn_token_bytes,
	       b.state_bytes / b.attn_token_bytes, tr->block_tokens);
	printf("prompt tokens %llu; attention-only prefix hits %llu tokens (%.1f%%)\n",
	       (unsigned long long)res[0].tokens, (unsigned long long)res[0].attn_hit_tokens,
	       res[0].tokens ? 100.0 * (double)res[0].attn_hit_tokens / (double)res[0].tokens : 0);
	printf("\n== checkpoints every N blocks: their bytes against the attention KV the hits "
	       "unlock ==\n");
	rp_print_hybrid(stdout, res, n, &b);
	printf("ended: checkpoints that ended a hit; ckpt/kv: all checkpoints kept / all "
	       "attention KV kept; ckpt-B/tok: checkpoints "
	       "on reused prefixes per reused token (x-attn: over the attention KV per token);\n"
	       "kept-B/tok: all checkpoints per reused token; hit-tok: the hybrid's hits (a hit "
	       "ends at its last checkpoint), of-attn: of the attention-only hits, lost-tok: the "
	       "difference\n");
	return 0;
}

/* Every policy and MIN at one capacity set (tiered: MIN at the sum); prints and fills @res. */
static int
rp_run_set(const struct rp_opts *o, const struct rp_trace *tr, const uint64_t cap[RP_TIERS],
	   int tiered, uint64_t bb, struct rp_result *res)
{
	size_t p;

	for (p = 0; p < o->n_pols; p++)
		if (rp_sim_run(tr, kvt_evict_by_name(o->pols[p]), cap, rp_progress, &res[p]))
			return -1;
	if (rp_min_run(tr, cap[0] + cap[1] + cap[2], rp_progress, &res[o->n_pols]))
		return -1;
	for (p = 0; p <= o->n_pols; p++)
		res[p].tiered = tiered;
	rp_print_table(stdout, res, o->n_pols + 1, bb);
	rp_summary(res, o->n_pols + 1);
	return 0;
}

/* CSV, JSON and the plot, as asked. 0 or 1 when one of them failed. */
static int
rp_outputs(const struct rp_opts *o, const struct rp_result *all, size_t n_all, uint64_t bb,
	   const double *ratio, const uint64_t tiers[RP_TIERS])
{
	const struct rp_result *tr = &all[o->n_caps * (o->n_pols + 1)]; /* the tiered run */
	const char *names[RP_MAX_POLS];
	double tiered[RP_MAX_POLS];
	size_t p;
	int rc = 0;

	if (o->csv && rp_write_csv(o->csv, all, n_all, bb))
		rc = 1;
	if (o->json && rp_write_json(o->json, all, n_all, bb))
		rc = 1;
	if (o->plot) {
		for (p = 0; p <= o->n_pols; p++) {
			names[p] = p < o->n_pols ? o->pols[p] : "min";
			tiered[p] = tr[p].refs ? (double)rp_hits(&tr[p]) / (double)tr[p].refs : 0;
		}
		if (rp_plot(o->plot, o->trace, o->caps, o->n_caps, names, o->n_pols + 1, ratio,
			    tiers, tiered))
			rc = 1;
	}
	return rc;
}

/* Can @path (output of option @opt) be written: it is not a directory, and its directory
 * exists and is writable (--plot writes PATH.dat and PATH.gp beside it), and an existing
 * @path is writable? 0, or -1 with "kvtier-replay: cannot write OPT PATH: reason". */
static int
rp_check_output(const char *opt, const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[4096];
	struct stat st;
	int err = 0;

	if (slash == path)
		snprintf(dir, sizeof dir, "/");
	else
		snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1,
			 slash ? path : ".");
	if (!*path)
		err = ENOENT;
	else if (stat(dir, &st))
		err = errno;
	else if (!S_ISDIR(st.st_mode))
		err = ENOTDIR;
	else if (access(dir, W_OK | X_OK))
		err = errno;
	else if (stat(path, &st) == 0)
		err = S_ISDIR(st.st_mode) ? EISDIR : access(path, W_OK) ? errno : 0;
	if (err) {
		fprintf(stderr, "kvtier-replay: cannot write %s %s: %s\n", opt, path,
			strerror(err));
		return -1;
	}
	return 0;
}

/* Every output path of the options can be written (before the run). 0 or -1. */
static int
rp_check_outputs(const struct rp_opts *o)
{
	if (o->csv && rp_check_output("--csv", o->csv))
		return -1;
	if (o->json && rp_check_output("--json", o->json))
		return -1;
	if (o->plot && rp_check_output("--plot", o->plot))
		return -1;
	if (o->plot && system("command -v gnuplot >/dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtier-replay: --plot needs gnuplot, which is not installed "
			"(apt-get install -y gnuplot-nox)\n");
		return -1;
	}
	return 0;
}

/* Capacities of the sweep and of the tiers, from the options. 0 or -1 (message printed). */
static int
rp_capacities(struct rp_opts *o, uint64_t bb, uint64_t tiers[RP_TIERS])
{
	static const uint64_t def_caps[] = { 1000, 2000, 4000, 8000, 16000, 32000, 64000 };
	int t;

	if (o->sweep_spec) {
		if (rp_parse_sweep(o, o->sweep_spec, bb))
			return -1;
	} else {
		memcpy(o->caps, def_caps, sizeof def_caps);
		o->n_caps = sizeof def_caps / sizeof def_caps[0];
	}
	for (t = 0; t < RP_TIERS; t++)
		if (o->tier_spec[t] && rp_parse_cap(o->tier_spec[t], bb, &tiers[t])) {
			fprintf(stderr, "kvtier-replay: --%s: bad capacity '%s' (blocks, 4k = 4000 "
				"blocks, or bytes ending in B: 512MiB, 1.5GiB)\n",
				t == 0 ? "hbm" : t == 1 ? "host" : "nvme", o->tier_spec[t]);
			return -1;
		}
	if (!tiers[0]) {
		fprintf(stderr, "kvtier-replay: --hbm must be at least one block\n");
		return -1;
	}
	return 0;
}

int
main(int argc, char **argv)
{
	struct rp_opts o;
	struct rp_trace tr;
	struct rp_result *all = NULL;
	uint64_t bb, tiers[RP_TIERS] = { 2000, 8000, 32000 }, one[RP_TIERS] = { 0 };
	size_t c, p, per;
	double *ratio = NULL;
	int rc = 1;

	if (rp_parse_args(argc, argv, &o) || rp_parse_pols(&o) || rp_check_outputs(&o))
		return 2;
	if (o.sweep_spec && rp_list_ok("--sweep", o.sweep_spec))
		return 2;
	if (rp_trace_load(o.trace, o.block_tokens, o.limit, &tr))
		return 1;
	bb = (uint64_t)tr.block_tokens * o.bytes_per_token;
	if (rp_capacities(&o, bb, tiers)) {
		rc = 2; /* a bad --sweep/--hbm/--host/--nvme: a usage error */
		goto out;
	}
	per = o.n_pols + 1;
	all = calloc((o.n_caps + 1) * per, sizeof *all);
	ratio = calloc(o.n_caps * per, sizeof *ratio);
	if (!all || !ratio)
		goto out;
	printf("trace %s: %u requests, %llu block references, %u-token blocks\n", o.trace,
	       tr.n_req, (unsigned long long)tr.n_ids, tr.block_tokens);
	if (o.data) {
		rc = rp_data_mode(&o, &tr, tiers) ? 1 : 0;
		goto out;
	}
	if (o.hybrid_model || o.state_bytes) {
		rc = rp_hybrid_mode(&o, &tr);
		goto out;
	}
	if (o.nodes_spec) {
		struct rp_multi_opts m;
		uint32_t nodes[RP_MAX_CAPS];
		size_t n_nodes;

		if (rp_parse_nodes(&o, bb, tiers, &m, nodes, &n_nodes)) {
			rc = 2;
			goto out;
		}
		rc = rp_nodes_mode(&o, &tr, &m, nodes, n_nodes);
		goto out;
	}
	printf("metadata-only: %llu bytes per block (--bytes-per-token %llu)\n",
	       (unsigned long long)bb, (unsigned long long)o.bytes_per_token);
	if (!tr.has_ids)
		printf("note: this trace has lengths only, no block hashes: every block is new, so "
		       "prefix hits are 0 by construction (arrivals, sizes and traffic still apply)\n");
	printf("\n== single tier (HBM only), capacity sweep ==\n");
	for (c = 0; c < o.n_caps; c++) {
		one[0] = o.caps[c];
		if (rp_run_set(&o, &tr, one, 0, bb, &all[c * per]))
			goto out;
		for (p = 0; p < per; p++)
			ratio[c * per + p] = all[c * per + p].refs ?
				(double)rp_hits(&all[c * per + p]) / (double)all[c * per + p].refs : 0;
	}
	printf("\n== tiers HBM %llu + HOST %llu + NVME %llu blocks (MIN at the sum) ==\n",
	       (unsigned long long)tiers[0], (unsigned long long)tiers[1],
	       (unsigned long long)tiers[2]);
	if (rp_run_set(&o, &tr, tiers, 1, bb, &all[o.n_caps * per]))
		goto out;
	rc = rp_outputs(&o, all, (o.n_caps + 1) * per, bb, ratio, tiers);
out:
	free(all);
	free(ratio);
	rp_trace_free(&tr);
	return rc;
}
