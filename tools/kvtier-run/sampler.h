/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/sampler.h - llama2.c's sampler: greedy argmax at temperature 0, otherwise
 * softmax(logits / temperature) sampled by llama2.c's xorshift generator, plainly
 * (topp <= 0 or >= 1) or by top-p (nucleus) sampling. Same seed, same logits -> same token as
 * llama2.c's run.c.
 */
#ifndef KVTR_SAMPLER_H
#define KVTR_SAMPLER_H

#include <stdint.h>

struct kvtr_prob_index {
	float prob;    /* probability */
	int32_t index; /* token id */
};

/** One sampler per sequence (it owns its random state). Not thread-safe. */
struct kvtr_sampler {
	int32_t vocab_size;                /* logits per call */
	float temperature;                 /* 0 = greedy */
	float topp;                        /* nucleus mass; <= 0 or >= 1 disables top-p */
	uint64_t rng_state;                /* llama2.c's rng state (unsigned long long) */
	struct kvtr_prob_index *probindex; /* [vocab_size] scratch for top-p */
};

/**
 * kvtr_sampler_init() - set up a sampler.
 * @seed: initial rng state; must be non-zero (xorshift stays at 0 forever); callers map
 *        llama2.c's "0 = time(NULL)" before calling.
 * Returns 0, -EINVAL (vocab_size < 1, seed 0, temperature < 0), -ENOMEM.
 */
int kvtr_sampler_init(struct kvtr_sampler *s, int32_t vocab_size, float temperature, float topp,
		      uint64_t seed);

/** kvtr_sampler_fini() - free the scratch; the struct is zeroed. */
void kvtr_sampler_fini(struct kvtr_sampler *s);

/**
 * kvtr_sampler_sample() - the next token from @logits [vocab_size]. At temperature > 0 the
 * logits are overwritten with the probabilities (as llama2.c does). Advances the rng state
 * only when temperature > 0.
 */
int32_t kvtr_sampler_sample(struct kvtr_sampler *s, float *logits);

/** llama2.c's random_u32()/random_f32() on an explicit state (exposed for tests). */
uint32_t kvtr_random_u32(uint64_t *state);
float kvtr_random_f32(uint64_t *state);

/** llama2.c's softmax() in place over @n values (exposed for tests and forward.c). */
void kvtr_softmax(float *x, int32_t n);

#endif /* KVTR_SAMPLER_H */
