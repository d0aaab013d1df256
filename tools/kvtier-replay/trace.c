/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-replay/trace.c - loading Mooncake JSONL (parsed with cJSON) and Azure CSV traces.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "replay.h"
#include "util.h"

#define TR_FORMATS "Mooncake JSONL (one {\"timestamp\", \"input_length\", \"hash_ids\"} " \
	"object per line) or Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens)"

/* Does the first non-empty line look like one of the two formats? */
static int
tr_format_known(const char *line)
{
	if (line[0] == '{' || strncmp(line, "TIMESTAMP", 9) == 0)
		return 1;
	/* an Azure row without its header: "YYYY-MM-DD hh:mm:ss.f,context,generated" */
	return line[0] >= '0' && line[0] <= '9' && strchr(line, ',') != NULL;
}

static int
tr_push_req(struct rp_trace *t, uint32_t *cap)
{
	void *p;

	if (t->n_req < *cap)
		return 0;
	*cap = *cap ? *cap * 2 : 1024;
	p = realloc(t->req, (size_t)*cap * sizeof *t->req);
	if (!p)
		return -1;
	t->req = p;
	return 0;
}

static int
tr_push_id(struct rp_trace *t, uint64_t *cap, uint32_t id)
{
	void *p;

	if (t->n_ids == *cap) {
		*cap = *cap ? *cap * 2 : 65536;
		p = realloc(t->ids, *cap * sizeof *t->ids);
		if (!p)
			return -1;
		t->ids = p;
	}
	t->ids[t->n_ids++] = id;
	if (id + 1 > t->max_id)
		t->max_id = id + 1;
	return 0;
}

static double
tr_num(const cJSON *o, const char *k, int *bad)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);

	if (!cJSON_IsNumber(v) || v->valuedouble < 0) {
		*bad = 1;
		return 0;
	}
	return v->valuedouble;
}

/* One Mooncake line: {"timestamp", "input_length", "output_length", "hash_ids": [...]} */
static int
tr_mooncake_line(struct rp_trace *t, const char *line, uint64_t *idcap, uint32_t lineno)
{
	cJSON *o = cJSON_Parse(line), *h, *x;
	struct rp_req *r = &t->req[t->n_req];
	int bad = 0;

	if (!o) {
		fprintf(stderr, "kvtier-replay: line %u: not JSON\n", lineno);
		return -1;
	}
	r->t_ms = (uint64_t)tr_num(o, "timestamp", &bad);
	r->in_tokens = (uint32_t)tr_num(o, "input_length", &bad);
	r->out_tokens = (uint32_t)tr_num(o, "output_length", &bad);
	h = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
	if (bad || !cJSON_IsArray(h)) {
		fprintf(stderr, "kvtier-replay: line %u: needs numbers timestamp, input_length, "
			"output_length and an array hash_ids\n", lineno);
		cJSON_Delete(o);
		return -1;
	}
	r->first = (uint32_t)t->n_ids;
	r->n = 0;
	cJSON_ArrayForEach(x, h) {
		if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= 4e9) {
			fprintf(stderr, "kvtier-replay: line %u: hash id out of range\n", lineno);
			cJSON_Delete(o);
			return -1;
		}
		if (tr_push_id(t, idcap, (uint32_t)x->valuedouble)) {
			cJSON_Delete(o);
			return -1;
		}
		r->n++;
	}
	if ((uint64_t)r->n * 512 < r->in_tokens) /* fewer ids than its 512-token blocks */
		t->short_ids++;
	cJSON_Delete(o);
	t->n_req++;
	return 0;
}

/* One Azure line: "YYYY-MM-DD HH:MM:SS.fffffff,ContextTokens,GeneratedTokens" */
static int
tr_azure_line(struct rp_trace *t, const char *line, uint64_t *idcap, uint32_t lineno,
	      double *t0)
{
	struct rp_req *r = &t->req[t->n_req];
	struct tm tm;
	unsigned in, out;
	double frac = 0, ts;
	char fr[16] = "0";
	uint32_t k;

	memset(&tm, 0, sizeof tm);
	if (sscanf(line, "%d-%d-%d %d:%d:%d.%15[0-9],%u,%u", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, fr, &in, &out) != 9) {
		fprintf(stderr, "kvtier-replay: line %u: not 'date time,context,generated'\n",
			lineno);
		return -1;
	}
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	frac = strtod(fr, NULL);
	while (frac >= 1.0)
		frac /= 10.0;
	ts = (double)timegm(&tm) + frac;
	if (*t0 < 0)
		*t0 = ts;
	r->t_ms = (uint64_t)((ts - *t0) * 1000.0);
	r->in_tokens = in;
	r->out_tokens = out;
	r->first = (uint32_t)t->n_ids;
	r->n = (in + t->block_tokens - 1) / t->block_tokens;
	for (k = 0; k < r->n; k++)
		if (tr_push_id(t, idcap, t->max_id))
			return -1;
	t->n_req++;
	return 0;
}

int
rp_trace_load(const char *path, uint32_t block_tokens, uint32_t limit, struct rp_trace *t)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t lcap = 0;
	ssize_t len;
	uint32_t rcap = 0, lineno = 0;
	uint64_t idcap = 0;
	double t0 = -1;
	int json = -1, rc = 0;
	struct stat st;

	memset(t, 0, sizeof *t);
	t->block_tokens = block_tokens;
	if (!f || fstat(fileno(f), &st)) {
		kvtr_err(-errno, "%s: %s", path, strerror(errno));
		fprintf(stderr, "kvtier-replay: %s\n", kvtr_last_error());
		if (f)
			fclose(f);
		return -1;
	}
	if (S_ISDIR(st.st_mode)) {
		kvtr_err(-EISDIR, "%s is a directory: give a trace file, " TR_FORMATS, path);
		fprintf(stderr, "kvtier-replay: %s\n", kvtr_last_error());
		fclose(f);
		return -1;
	}
	while (rc == 0 && (len = getline(&line, &lcap, f)) >= 0) {
		lineno++;
		if (len <= 1 || (limit && t->n_req >= limit))
			continue;
		if (json < 0) {
			if (!tr_format_known(line)) {
				kvtr_err(-EINVAL, "%s: line %u: not a trace format kvtier-replay "
					 "reads: " TR_FORMATS, path, lineno);
				fprintf(stderr, "kvtier-replay: %s\n", kvtr_last_error());
				rc = -1;
				break;
			}
			json = line[0] == '{';
			t->has_ids = json;
			if (json)
				t->block_tokens = 512; /* Mooncake's hash_ids are 512-token blocks */
			else if (strncmp(line, "TIMESTAMP", 9) == 0)
				continue; /* Azure header */
		}
		if ((rc = tr_push_req(t, &rcap)) != 0)
			break;
		rc = json ? tr_mooncake_line(t, line, &idcap, lineno) :
			    tr_azure_line(t, line, &idcap, lineno, &t0);
	}
	free(line);
	fclose(f);
	if (rc == 0 && t->n_req == 0) {
		fprintf(stderr, "kvtier-replay: %s: no requests (expected " TR_FORMATS ")\n", path);
		rc = -1;
	}
	if (rc == 0 && t->short_ids)
		fprintf(stderr, "kvtier-replay: warning: %s: %u requests have fewer hash_ids than "
			"ceil(input_length / 512)\n", path, t->short_ids);
	if (rc)
		rp_trace_free(t);
	return rc;
}

void
rp_trace_free(struct rp_trace *t)
{
	free(t->req);
	free(t->ids);
	memset(t, 0, sizeof *t);
}

uint32_t
rp_block_tokens(const struct rp_trace *t, const struct rp_req *r, uint32_t k)
{
	uint64_t start = (uint64_t)k * t->block_tokens;

	if (start >= r->in_tokens)
		return 0;
	return r->in_tokens - start < t->block_tokens ? (uint32_t)(r->in_tokens - start) :
							 t->block_tokens;
}
