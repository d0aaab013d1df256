/* SPDX-License-Identifier: MIT */
/* tools/kvtier-run/sampler.c - llama2.c's sampling, operation for operation. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "util.h"

uint32_t
kvtr_random_u32(uint64_t *state)
{
	/* xorshift rng: https://en.wikipedia.org/wiki/Xorshift#xorshift.2A */
	*state ^= *state >> 12;
	*state ^= *state << 25;
	*state ^= *state >> 27;
	return (uint32_t)((*state * UINT64_C(0x2545F4914F6CDD1D)) >> 32);
}

float
kvtr_random_f32(uint64_t *state)
{
	return (float)(kvtr_random_u32(state) >> 8) / 16777216.0f;
}

void
kvtr_softmax(float *x, int32_t n)
{
	float max_val = x[0], sum = 0.0f;

	for (int32_t i = 1; i < n; i++)
		if (x[i] > max_val)
			max_val = x[i];
	for (int32_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - max_val);
		sum += x[i];
	}
	for (int32_t i = 0; i < n; i++)
		x[i] /= sum;
}

static int32_t
sampler_argmax(const float *p, int32_t n)
{
	int32_t max_i = 0;
	float max_p = p[0];

	for (int32_t i = 1; i < n; i++) {
		if (p[i] > max_p) {
			max_i = i;
			max_p = p[i];
		}
	}
	return max_i;
}

static int32_t
sampler_mult(const float *p, int32_t n, float coin)
{
	float cdf = 0.0f;

	for (int32_t i = 0; i < n; i++) {
		cdf += p[i];
		if (coin < cdf)
			return i;
	}
	return n - 1; /* rounding */
}

static int
sampler_cmp(const void *a, const void *b)
{
	const struct kvtr_prob_index *x = a, *y = b;

	if (x->prob > y->prob)
		return -1;
	if (x->prob < y->prob)
		return 1;
	return 0;
}

static int32_t
sampler_topp(const float *p, int32_t n, float topp, struct kvtr_prob_index *pi, float coin)
{
	/* values below (1 - topp) / (n - 1) cannot be part of the result: crop them first */
	const float cutoff = (1.0f - topp) / (float)(n - 1);
	float cumulative = 0.0f, r, cdf = 0.0f;
	int32_t n0 = 0, last;

	for (int32_t i = 0; i < n; i++) {
		if (p[i] >= cutoff) {
			pi[n0].index = i;
			pi[n0].prob = p[i];
			n0++;
		}
	}
	qsort(pi, (size_t)n0, sizeof(*pi), sampler_cmp);
	last = n0 - 1;
	for (int32_t i = 0; i < n0; i++) {
		cumulative += pi[i].prob;
		if (cumulative > topp) {
			last = i;
			break;
		}
	}
	r = coin * cumulative;
	for (int32_t i = 0; i <= last; i++) {
		cdf += pi[i].prob;
		if (r < cdf)
			return pi[i].index;
	}
	return pi[last].index;
}

int
kvtr_sampler_init(struct kvtr_sampler *s, int32_t vocab_size, float temperature, float topp,
		  uint64_t seed)
{
	memset(s, 0, sizeof(*s));
	if (vocab_size < 1 || seed == 0 || !(temperature >= 0.0f))
		return kvtr_err(-EINVAL, "sampler: bad parameters (vocab %d, seed %llu, "
				"temperature %g)", vocab_size, (unsigned long long)seed,
				(double)temperature);
	s->probindex = calloc((size_t)vocab_size, sizeof(*s->probindex));
	if (!s->probindex)
		return kvtr_err(-ENOMEM, "out of memory for the sampler");
	s->vocab_size = vocab_size;
	s->temperature = temperature;
	s->topp = topp;
	s->rng_state = seed;
	return 0;
}

void
kvtr_sampler_fini(struct kvtr_sampler *s)
{
	free(s->probindex);
	memset(s, 0, sizeof(*s));
}

int32_t
kvtr_sampler_sample(struct kvtr_sampler *s, float *logits)
{
	float coin;

	if (s->temperature == 0.0f)
		return sampler_argmax(logits, s->vocab_size);
	for (int32_t q = 0; q < s->vocab_size; q++)
		logits[q] /= s->temperature;
	kvtr_softmax(logits, s->vocab_size);
	coin = kvtr_random_f32(&s->rng_state);
	if (s->topp <= 0.0f || s->topp >= 1.0f)
		return sampler_mult(logits, s->vocab_size, coin);
	return sampler_topp(logits, s->vocab_size, s->topp, s->probindex, coin);
}
