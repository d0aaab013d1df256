/* SPDX-License-Identifier: MIT */
/*
 * kernels/linear.h - decode steps of linear-attention layers (internal, C reference): the gated
 * delta rule recurrence and the causal short convolution of Gated DeltaNet (Qwen3-Next,
 * Qwen3.5), reading and writing the per-sequence state in place (issue 17: STATE groups).
 *
 * Gated delta rule (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with
 * Delta Rule", arXiv 2412.06464, eq. 10; the exact arithmetic is transformers'
 * models/qwen3_next/modeling_qwen3_next.py torch_recurrent_gated_delta_rule, the one-token
 * path of Qwen3NextGatedDeltaNet.forward). Per value head h (n_v_heads of them), with key head
 * kh = h / (n_v_heads / n_k_heads) (transformers' repeat_interleave of q and k):
 *   qn = l2norm(q[kh]) / sqrt(k_dim)       l2norm(x) = x / sqrt(sum x^2 + 1e-6) (FLA's l2norm);
 *   kn = l2norm(k[kh])                     without l2norm (flag 0) q and k are used as given,
 *                                          q still divided by sqrt(k_dim)
 *   S  = S * exp(g[h])                     S = state[h], [k_dim][v_dim]; g <= 0 the log decay
 *   kv_mem[j] = sum_i S[i][j] kn[i]
 *   delta[j]  = (v[h][j] - kv_mem[j]) * beta[h]
 *   S[i][j]  += kn[i] delta[j]
 *   out[h][j] = sum_i S[i][j] qn[i]
 * i.e. S' = d S + beta kn (v - d S^T kn)^T with d = exp(g) (the paper's S_t = S_{t-1} a_t
 * (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, transposed); every column j of S evolves
 * independently. The gates come from the layer's projections as
 * transformers computes them: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
 * (kvt_gdn_gates_ref()). All arithmetic is fp32 (transformers casts q, k, v, g, beta and the
 * state to float32 in that function); the state may be stored as F32, F16 or BF16 (read,
 * updated in fp32, rounded back to nearest even once per step).
 * Layouts (row-major, contiguous): q, k [n_k_heads][k_dim]; v, out [n_v_heads][v_dim];
 * state [n_v_heads][k_dim][v_dim] (transformers' recurrent_states[layer] of one sequence).
 *
 * Short convolution (transformers' causal_conv1d_update with activation "silu", the depthwise
 * Conv1d of kernel K = linear_conv_kernel_dim over the concatenated [q | k | v] projection,
 * conv_dim = 2 n_k_heads k_dim + n_v_heads v_dim channels, no bias in Qwen3-Next). The state
 * holds, per channel, the previous K - 1 inputs, oldest first: [channels][K - 1] (vLLM's
 * layout; transformers keeps K values, the last K - 1 of which are these). One step:
 *   y[c] = bias[c] + sum_{j < K-1} w[c][j] state[c][j] + w[c][K-1] x[c]   (j ascending, fp32)
 *   out[c] = silu(y[c]) = y / (1 + exp(-y))   (or y when silu is 0)
 *   state[c] = state[c][1..K-2], x[c]         (shifted left by one, x appended)
 * w is the Conv1d weight [channels][1][K] read as [channels][K].
 *
 * The GPU versions (KVT_WITH_CUDA builds) are in kernels/kernels_cuda.h; they match these
 * within fp32 rounding. Everything here is a pure function of its arguments (apart from the
 * state it updates) and thread-safe for distinct states.
 */
#ifndef KVT_KERNELS_LINEAR_H
#define KVT_KERNELS_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The epsilon of the l2norm of q and k (transformers' l2norm(eps=1e-6) in the kernel). */
#define KVT_GDN_L2NORM_EPS 1e-6f

/** Shapes of one Gated DeltaNet layer's recurrent state (one sequence). */
struct kvt_gdn_shape {
	uint32_t n_k_heads;       /* linear_num_key_heads, >= 1 */
	uint32_t n_v_heads;       /* linear_num_value_heads, a positive multiple of n_k_heads */
	uint32_t k_dim;           /* linear_key_head_dim, >= 1 */
	uint32_t v_dim;           /* linear_value_head_dim, >= 1 */
	enum kvt_dtype dtype;     /* of the state: F32, F16 or BF16 */
	int l2norm;               /* 1: l2-normalise q and k (Qwen3-Next's
				   * use_qk_l2norm_in_kernel) */
};

/**
 * kvt_gdn_state_bytes() - bytes of one layer's recurrent state:
 * n_v_heads * k_dim * v_dim * element size; 0 for a bad shape or dtype.
 */
uint64_t kvt_gdn_state_bytes(const struct kvt_gdn_shape *s);

/**
 * kvt_gdn_gates_ref() - the gates of one token, as transformers' Qwen3NextGatedDeltaNet:
 * g[h] = -exp(A_log[h]) * softplus(a[h] + dt_bias[h]) (softplus(x) = log1p(exp(x)), x for
 * x > 20, as torch), beta[h] = sigmoid(b[h]) = 1 / (1 + exp(-b[h])); all [n_v_heads] fp32.
 * Returns 0 or -EINVAL (a NULL pointer, n_v_heads 0).
 */
int kvt_gdn_gates_ref(const float *A_log, const float *dt_bias, const float *a, const float *b,
		      uint32_t n_v_heads, float *g, float *beta);

/**
 * kvt_gdn_step_ref() - one decode step of the gated delta rule (formula above).
 * @s:     shapes and the state's dtype.
 * @state: [n_v_heads][k_dim][v_dim] of s->dtype, read and written in place (caller owns it;
 *         no alignment needed).
 * @q, @k: [n_k_heads][k_dim] fp32, after the short convolution (not normalised: the kernel
 *         applies the l2norm when s->l2norm).
 * @v:     [n_v_heads][v_dim] fp32.
 * @g:     [n_v_heads] fp32 log decay (<= 0 in the model; any finite value is accepted).
 * @beta:  [n_v_heads] fp32 write strength (sigmoid: in (0, 1)).
 * @out:   [n_v_heads][v_dim] fp32 (the core attention output, before the gated RMSNorm).
 * @scratch: >= 2 * k_dim floats of work space (the normalised q and k).
 * Returns 0 or -EINVAL (with a message): a NULL pointer, a zero dimension, n_v_heads not a
 * multiple of n_k_heads, a bad dtype. Nothing is written on error.
 */
int kvt_gdn_step_ref(const struct kvt_gdn_shape *s, void *state, const float *q, const float *k,
		     const float *v, const float *g, const float *beta, float *scratch, float *out);

/** Shapes of one short-convolution state (one sequence, one layer). */
struct kvt_conv_shape {
	uint32_t channels;        /* conv_dim, >= 1 */
	uint32_t kernel;          /* K = linear_conv_kernel_dim, 2..64; the state keeps K - 1 */
	enum kvt_dtype dtype;     /* of the state: F32, F16 or BF16 */
	int silu;                 /* 1: SiLU after the convolution (Qwen3-Next); 0: none */
};

/** kvt_conv_state_bytes() - channels * (kernel - 1) * element size; 0 for a bad shape. */
uint64_t kvt_conv_state_bytes(const struct kvt_conv_shape *s);

/**
 * kvt_conv_step_ref() - one decode step of the causal depthwise convolution (formula above).
 * @state:  [channels][kernel - 1] of s->dtype, oldest input first, updated in place (a new
 *          sequence starts from zeros, as transformers' zero left padding).
 * @x:      [channels] fp32, this token's input (the [q | k | v] projection).
 * @weight: [channels][kernel] fp32 (Conv1d weight [channels][1][kernel]).
 * @bias:   [channels] fp32 or NULL (none; Qwen3-Next has none).
 * @out:    [channels] fp32; may not alias x.
 * Returns 0 or -EINVAL (with a message): a NULL pointer, channels 0, kernel outside 2..64, a
 * bad dtype. Nothing is written on error.
 */
int kvt_conv_step_ref(const struct kvt_conv_shape *s, void *state, const float *x,
		      const float *weight, const float *bias, float *out);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_LINEAR_H */
