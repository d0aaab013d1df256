/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-hf/check.c - the reference of tools/hf-fixtures/gen.py (reference.json and its
 * logits.safetensors) and the comparison of a run with it (hf.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "hf.h"
#include "util.h"

static int
ref_ids(const cJSON *j, const char *key, int32_t **out, uint32_t *n)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key), *x;
	uint32_t i = 0;

	if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1)
		return kvtr_err(KVT_EFORMAT, "reference.json: %s must be a non-empty array", key);
	*out = calloc((size_t)cJSON_GetArraySize(a), sizeof(int32_t));
	if (!*out)
		return kvtr_err(-ENOMEM, "out of memory");
	cJSON_ArrayForEach(x, a) {
		if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e9)
			return kvtr_err(KVT_EFORMAT, "reference.json: %s[%u] is not a token id",
					key, i);
		(*out)[i++] = (int32_t)x->valuedouble;
	}
	*n = i;
	return 0;
}

int
kvhf_ref_load(const char *dir, struct kvhf_ref *ref)
{
	char path[4096], *buf = NULL;
	const cJSON *lf, *mm;
	cJSON *j = NULL;
	uint64_t n = 0, shape[4] = { 0 };
	int nd = 0, rc;
	FILE *f;
	long len;

	memset(ref, 0, sizeof(*ref));
	snprintf(path, sizeof(path), "%s/reference.json", dir);
	f = fopen(path, "rb");
	if (!f)
		return kvtr_err(-errno, "cannot open %s: %s", path, strerror(errno));
	if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)len + 1)) != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len)
		buf[len] = '\0';
	else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (!buf)
		return kvtr_err(-EIO, "cannot read %s", path);
	j = cJSON_Parse(buf);
	free(buf);
	if (!cJSON_IsObject(j)) {
		rc = kvtr_err(KVT_EFORMAT, "%s is not a JSON object", path);
		goto out;
	}
	if ((rc = ref_ids(j, "prompt_ids", &ref->prompt, &ref->n_prompt)) ||
	    (rc = ref_ids(j, "generated_ids", &ref->gen, &ref->n_gen)))
		goto out;
	mm = cJSON_GetObjectItemCaseSensitive(j, "min_greedy_margin");
	ref->min_margin = cJSON_IsNumber(mm) ? mm->valuedouble : 0.0;
	lf = cJSON_GetObjectItemCaseSensitive(j, "logits_file");
	snprintf(path, sizeof(path), "%s/%s", dir,
		 cJSON_IsString(lf) ? lf->valuestring : "logits.safetensors");
	rc = kvhf_safetensors_f32(path, "logits", &ref->logits, &n, shape, &nd);
	if (rc)
		goto out;
	if (nd != 2 || shape[0] != ref->n_prompt + ref->n_gen - 1) {
		rc = kvtr_err(KVT_EFORMAT, "%s: logits must be [%u, vocab]", path,
			      ref->n_prompt + ref->n_gen - 1);
		goto out;
	}
	ref->n_logits = (uint32_t)shape[0];
	ref->vocab = (uint32_t)shape[1];
out:
	cJSON_Delete(j);
	if (rc)
		kvhf_ref_free(ref);
	return rc;
}

int
kvhf_ref_resplit(struct kvhf_ref *ref, uint32_t n_prompt)
{
	uint32_t P = ref->n_prompt + ref->n_gen;
	int32_t *pr, *gen;

	if (n_prompt < ref->n_prompt || n_prompt >= P)
		return kvtr_err(-EINVAL, "a prompt of %u tokens: the reference path has a prompt of "
				"%u and %u tokens in all (at least one must be generated)",
				n_prompt, ref->n_prompt, P);
	pr = malloc((size_t)n_prompt * sizeof(int32_t));
	gen = malloc((size_t)(P - n_prompt) * sizeof(int32_t));
	if (!pr || !gen) {
		free(pr);
		free(gen);
		return kvtr_err(-ENOMEM, "out of memory");
	}
	memcpy(pr, ref->prompt, (size_t)ref->n_prompt * sizeof(int32_t));
	memcpy(pr + ref->n_prompt, ref->gen, (size_t)(n_prompt - ref->n_prompt) * sizeof(int32_t));
	memcpy(gen, ref->gen + (n_prompt - ref->n_prompt), (size_t)(P - n_prompt) * sizeof(int32_t));
	free(ref->prompt);
	free(ref->gen);
	ref->prompt = pr;
	ref->gen = gen;
	ref->n_prompt = n_prompt;
	ref->n_gen = P - n_prompt;
	return 0;
}

void
kvhf_ref_free(struct kvhf_ref *ref)
{
	free(ref->prompt);
	free(ref->gen);
	free(ref->logits);
	memset(ref, 0, sizeof(*ref));
}

int
kvhf_check(const struct kvhf_ref *ref, const struct kvhf_result *r, double tol,
	   double *max_diff)
{
	uint32_t P = ref->n_prompt + ref->n_gen, V = ref->vocab, first = P, rows;
	double worst = 0.0;
	uint32_t wp = 0, wi = 0;

	*max_diff = 0.0;
	if (r->n_tokens != P || r->n_logits != ref->n_logits)
		return kvtr_err(KVT_EFORMAT, "the run has %u tokens and %u logit rows, the reference "
				"%u and %u", r->n_tokens, r->n_logits, P, ref->n_logits);
	for (uint32_t p = 0; p < P && first == P; p++) {
		int32_t want = p < ref->n_prompt ? ref->prompt[p] : ref->gen[p - ref->n_prompt];

		if (r->tokens[p] != want)
			first = p;
	}
	/* the rows of the positions both paths share: all of them, or those before the first
	 * token that differs (the row after position first - 1 chose it) */
	rows = first < ref->n_logits ? first : ref->n_logits;
	for (uint32_t p = 0; p < rows; p++)
		for (uint32_t i = 0; i < V; i++) {
			double d = fabs((double)r->logits[(size_t)p * V + i] -
					(double)ref->logits[(size_t)p * V + i]);

			if (!(d <= worst)) { /* NaN too */
				worst = isnan(d) ? INFINITY : d;
				wp = p;
				wi = i;
			}
		}
	*max_diff = worst;
	if (first < P) {
		uint32_t p = first;
		int32_t want = p < ref->n_prompt ? ref->prompt[p] : ref->gen[p - ref->n_prompt];

		if (p >= 1 && p - 1 < ref->n_logits &&
		    kvhf_argmax(ref->logits + (size_t)(p - 1) * V, (int)V) == r->tokens[p])
			return kvtr_err(KVT_EFORMAT, "token %u (generated step %d) is %d, the "
					"reference has %d, but %d is the argmax of the reference's "
					"own logits after position %u: its greedy path and its single "
					"forward pass disagree there (tools/hf-fixtures/gen.py warned "
					"so when it wrote it; DSA indexer ties: tools/kvtier-hf/dsa.h), "
					"and no run can match both", p, (int)p - (int)ref->n_prompt,
					r->tokens[p], want, r->tokens[p], p - 1);
		return kvtr_err(KVT_EFORMAT, "token %u (generated step %d) is %d, the reference "
				"has %d", p, (int)p - (int)ref->n_prompt, r->tokens[p], want);
	}
	if (!(worst <= tol))
		return kvtr_err(KVT_EFORMAT, "logit %u after position %u differs by %g (tolerance "
				"%g): %.9g here, %.9g in the reference", wi, wp, worst, tol,
				r->logits[(size_t)wp * V + wi], ref->logits[(size_t)wp * V + wi]);
	return 0;
}
