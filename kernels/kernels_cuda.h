/* SPDX-License-Identifier: MIT */
/*
 * kernels/kernels_cuda.h - launchers of the CUDA kernels (internal; KVT_WITH_CUDA builds only).
 *
 * Every launcher is extern "C", takes the stream last and returns 0, -EINVAL (bad arguments,
 * checked on the host before anything is queued) or KVT_EDEVICE (launch failed; the CUDA message
 * is in kvt_last_error_message()). Launches are asynchronous: errors of the kernel's execution
 * show up at the next synchronising call on the stream. All pointers named "device" must be
 * readable (writable) by the GPU: cudaMalloc'd memory, or pinned host memory mapped into the
 * device address space (cudaHostAlloc with cudaHostAllocMapped, or any pinned memory under
 * unified addressing). Thread-safety: as the CUDA runtime (any thread, any stream).
 *
 * The header is includable from C: the stream is then a void * (a cudaStream_t is a pointer;
 * NULL is the legacy default stream).
 *
 * Reference implementations for CPU: kernels/attention.h (kvt_attn_decode_ref & co.),
 * kernels/gather.h (gather/scatter), kernels/quant.h (int8/fp8 quantization).
 */
#ifndef KVT_KERNELS_KERNELS_CUDA_H
#define KVT_KERNELS_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <cuda_runtime.h>
typedef cudaStream_t kvt_cuda_stream_t;
extern "C" {
#else
typedef void *kvt_cuda_stream_t;
#endif

#include "kernels/attention.h"
#include "kernels/linear.h"
#include "kernels/sparse.h"

/** Largest number of KV splits one decode launch accepts (gridDim.y). */
#define KVT_ATTN_CUDA_MAX_SPLITS 65535u

/**
 * kvt_attn_cuda_work_floats() - size of the @work buffer of kvt_attn_decode_cuda(), in floats:
 * n_splits * n_heads * (head_dim + 2) for n_splits > 1 (the per-split partials o, m, l), 0 for
 * n_splits <= 1.
 */
size_t kvt_attn_cuda_work_floats(uint32_t n_heads, uint32_t head_dim, uint32_t n_splits);

/**
 * kvt_attn_cuda_splits() - a good @n_splits for kvt_attn_decode_cuda(): enough windows that the
 * launch has about 4 thread blocks per SM (@n_sm, cudaDevAttrMultiProcessorCount), but windows
 * of at least 256 positions; 1..KVT_ATTN_CUDA_MAX_SPLITS. Pure function.
 */
uint32_t kvt_attn_cuda_splits(uint32_t n_heads, uint32_t n_kv_heads, uint64_t seq_len, int n_sm);

/**
 * kvt_attn_cuda_force_generic() - test knob: @on != 0 makes every later launch use the generic
 * kernel (one warp per position, element loads) instead of the vectorised one, so tests check
 * both. Process-wide; not for concurrent use with launches on other threads.
 */
void kvt_attn_cuda_force_generic(int on);

/**
 * kvt_attn_decode_cuda() - paged decode attention of one query token (see attention.h for the
 * function and the K/V addressing), split-KV over the GPU.
 * @kv:       paged K/V of one layer (host struct, copied into the launch): k_base and table are
 *            device pointers; table [ceil(seq_len / tokens_per_block)] slot ids. k_base,
 *            block_stride, token_stride and v_offset must be multiples of the element size.
 * @q:        device [n_heads][head_dim] fp32 query.
 * @n_heads:  query heads, a positive multiple of kv->n_kv_heads (GQA: head h reads KV head
 *            h / (n_heads / n_kv_heads)).
 * @seq_len:  positions [0, seq_len) attended, >= 1.
 * @n_splits: 1..KVT_ATTN_CUDA_MAX_SPLITS windows of ceil(seq_len / n_splits) positions, each
 *            reduced by one thread block per head with an online softmax, then merged by a
 *            second kernel with the log-sum-exp rule of kvt_attn_merge(). Fewer are used when
 *            seq_len is small (never an empty window). 1 = a single kernel, no @work.
 * @work:     device scratch of kvt_attn_cuda_work_floats(n_heads, kv->head_dim, n_splits)
 *            floats; may be NULL when n_splits == 1. Must not be shared by launches that may
 *            run concurrently.
 * @out:      device [n_heads][head_dim] fp32 result.
 * @stream:   the stream to queue the kernels on.
 * Kernels: when a KV row (head_dim elements) is a whole number of 16-byte pieces, at most 32,
 * and k_base and all strides are 16-byte aligned, the vectorised kernel runs (16-byte loads, up
 * to 4 query heads of one KV head per thread block, state in registers); otherwise the generic
 * one (one warp per position, element loads).
 * K/V F32, F16 or BF16 are widened to fp32; all accumulation is fp32. The result matches
 * kvt_attn_decode_ref() within fp32 rounding (different summation order, online softmax,
 * the device's expf), not bit for bit. kv->head_dim must be <= 4096 (the layout's limit).
 * Window and sinks (kv->window, kv->sink, kv->pos; attention.h): only the visible positions are
 * read, split over the GPU as one run of positions; kv->pos is a device [n_entries] array. The
 * host cannot check pos: the caller guarantees the attention.h contract (strictly ascending,
 * every block holding a visible position present), which kvt_attn_decode_ref() checks.
 */
int kvt_attn_decode_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			 uint64_t seq_len, uint32_t n_splits, float *work, float *out,
			 kvt_cuda_stream_t stream);

/**
 * kvt_attn_partial_cuda() - the split-KV partial of positions [t0, t1) (t0 < t1), as
 * kvt_attn_partial_ref(): device out [n_heads][head_dim] normalised within the window,
 * m [n_heads] max score, l [n_heads] sum of exp(score - m). One thread block per head.
 * Requirements on @kv, @q, @n_heads as kvt_attn_decode_cuda(). With a window only the visible
 * positions of [t0, t1) are read (the query at kv->seq_len - 1, or t1 - 1 when 0); when none is
 * visible the partial is written empty (out 0, m -INFINITY, l 0), as kvt_attn_partial_ref().
 */
int kvt_attn_partial_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			  uint64_t t0, uint64_t t1, float *out, float *m, float *l,
			  kvt_cuda_stream_t stream);

/**
 * kvt_attn_partial_split_cuda() - kvt_attn_partial_cuda() over the whole GPU: the window
 * [t0, t1) is cut into @n_splits sub-windows of ceil((t1 - t0) / n_splits) positions, one thread
 * block per (head, sub-window), whose partials are merged by the log-sum-exp rule (FlashDecoding,
 * Dao et al. 2023) into the same out [n_heads][head_dim], m [n_heads] and l [n_heads] as
 * kvt_attn_partial_ref() gives; so a long streamed window keeps every SM busy where one split
 * would launch only n_heads thread blocks. Pick @n_splits with kvt_attn_cuda_splits(t1 - t0).
 * @n_splits: 1..KVT_ATTN_CUDA_MAX_SPLITS.
 * @work:     device scratch of kvt_attn_cuda_work_floats(n_heads, kv->head_dim, n_splits)
 *            floats; may be NULL when n_splits == 1; not shared by launches that may overlap.
 * Asynchronous on @stream (NULL: the legacy default stream); caller owns every buffer.
 * Returns 0, -EINVAL (bad argument, as kvt_attn_partial_cuda(); n_splits out of range; NULL
 * @work with n_splits > 1), or KVT_EDEVICE (launch failed, the CUDA message kept).
 */
int kvt_attn_partial_split_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
				uint64_t t0, uint64_t t1, uint32_t n_splits, float *work,
				float *out, float *m, float *l, kvt_cuda_stream_t stream);

/**
 * kvt_attn_latent_cuda_work_floats() - size of the @work buffer of the latent launchers, in
 * floats: n_splits * n_heads * (kv_lora_rank + 2) for n_splits > 1, else 0.
 */
size_t kvt_attn_latent_cuda_work_floats(uint32_t n_heads, uint32_t kv_lora_rank,
					uint32_t n_splits);

/**
 * kvt_attn_latent_cuda_splits() - a good @n_splits for the latent launchers: about 4 thread
 * blocks per SM (@n_sm) counting ceil(n_heads / 8) blocks per window, windows of at least 256
 * visible positions (@n_visible: seq_len, or min(seq_len, window + sink)); 1..
 * KVT_ATTN_CUDA_MAX_SPLITS. Pure function.
 */
uint32_t kvt_attn_latent_cuda_splits(uint32_t n_heads, uint64_t n_visible, int n_sm);

/**
 * kvt_attn_latent_decode_cuda() - MLA decode attention in the absorbed form (attention.h: the
 * formula and its sources), as kvt_attn_latent_decode_ref(), split-KV over the GPU.
 * @kv:       paged latent of one layer (host struct): base, table (and pos) device pointers;
 *            base, block_stride and token_stride multiples of the element size;
 *            kv_lora_rank + rope_dim <= 2048 (shared memory: one widened tile of rows).
 * @q_lat:    device [n_heads][kv_lora_rank] fp32; @q_pe device [n_heads][rope_dim] fp32 (may be
 *            NULL when rope_dim is 0).
 * @n_heads:  query heads (all share the latent: each thread block reads a tile of latent rows
 *            once for up to 8 heads).
 * @seq_len:  positions [0, seq_len), >= 1; only the visible ones (window, sink) are read.
 * @scale:    score scale, finite and > 0.
 * @n_splits: 1..KVT_ATTN_CUDA_MAX_SPLITS windows of the visible positions, merged with the
 *            log-sum-exp rule of kvt_attn_merge(); fewer when short. 1 = no @work.
 * @work:     device scratch of kvt_attn_latent_cuda_work_floats() floats, NULL when n_splits 1;
 *            not shared by launches that may overlap.
 * @out:      device [n_heads][kv_lora_rank] fp32.
 * fp32 accumulation; matches the reference within fp32 rounding, not bit for bit.
 * Returns 0, -EINVAL (the reference's checks, alignment, sizes), KVT_EDEVICE (launch failed).
 */
int kvt_attn_latent_decode_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
				const float *q_pe, uint32_t n_heads, uint64_t seq_len, float scale,
				uint32_t n_splits, float *work, float *out,
				kvt_cuda_stream_t stream);

/**
 * kvt_attn_latent_partial_cuda() - the split-KV partial of the visible positions of [t0, t1),
 * as kvt_attn_latent_partial_ref(): device out [n_heads][kv_lora_rank], m [n_heads],
 * l [n_heads] (empty: 0, -INFINITY, 0 when nothing is visible). @n_splits and @work as the
 * decode. Returns 0, -EINVAL, KVT_EDEVICE.
 */
int kvt_attn_latent_partial_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
				 const float *q_pe, uint32_t n_heads, uint64_t t0, uint64_t t1,
				 float scale, uint32_t n_splits, float *work, float *out,
				 float *m, float *l, kvt_cuda_stream_t stream);

/**
 * kvt_gather_blocks_cuda() - copy a byte range of each of n slots into a packed buffer in one
 * launch: for i in 0..n-1,
 *   dst[i * len .. (i + 1) * len) = base[slots[i] * slot_stride + offset .. + len).
 * With offset 0 and len block_bytes it moves whole blocks; with offset l * layer_block_bytes and
 * len layer_block_bytes it moves layer l of each block (layer-wise transfers).
 * @dst:    device (or mapped pinned host) [n][len] bytes; must not overlap the source ranges.
 * @base:   device address of slot 0 (or mapped host memory, for the reverse direction).
 * @slot_stride: bytes between slots (block_bytes).
 * @offset, @len: the range within each slot; len >= 1, offset + len <= slot_stride.
 * @slots:  device-readable [n] slot ids.
 * @n:      number of slots; 0 queues nothing and returns 0.
 * When base, dst, slot_stride, offset and len are all multiples of 16 the copy moves 16-byte
 * words, otherwise bytes.
 */
int kvt_gather_blocks_cuda(void *dst, const void *base, uint64_t slot_stride, uint64_t offset,
			   uint64_t len, const uint32_t *slots, uint32_t n,
			   kvt_cuda_stream_t stream);

/**
 * kvt_scatter_blocks_cuda() - the inverse of kvt_gather_blocks_cuda(): for i in 0..n-1,
 *   base[slots[i] * slot_stride + offset .. + len) = src[i * len .. (i + 1) * len).
 * Slot ids must be distinct (two copies into one slot race). Arguments as in the gather.
 */
int kvt_scatter_blocks_cuda(void *base, uint64_t slot_stride, uint64_t offset, uint64_t len,
			    const void *src, const uint32_t *slots, uint32_t n,
			    kvt_cuda_stream_t stream);

/** Copies per kvt_copy_batch_cuda() launch (the list is a by-value launch parameter). */
#define KVT_COPY_KERNEL_CHUNK 128u

/** One copy of kvt_copy_batch_cuda(): device-addressable @dst and @src, @len bytes. */
struct kvt_cuda_copy {
	void *dst;       /* device memory or mapped pinned host memory */
	const void *src; /* likewise; must not overlap dst */
	uint64_t len;    /* bytes; 0 copies nothing */
};

/**
 * kvt_copy_batch_cuda() - perform @n independent copies with one kernel launch per
 * KVT_COPY_KERNEL_CHUNK of them, queued on @stream (so each copy sees what earlier work on the
 * stream wrote, and later work sees the copy). The CUDA backend's fallback for a copy batch
 * where cudaMemcpyBatchAsync is absent (CUDA < 12.8), refused, or not allowed (legacy stream):
 * one launch per 128 blocks instead of one cudaMemcpyAsync per block (5-7 us each).
 * @v:      host array of @n copies, read before the call returns (the caller may reuse it).
 *          Every address must be addressable by the GPU: cudaMalloc memory or cudaHostAlloc
 *          memory (mapped under UVA); pageable memory faults the kernel. Copies must not
 *          overlap each other's destinations.
 * A copy whose two addresses are multiples of 16 moves 16-byte words (its last len % 16 bytes
 * one by one), else bytes. The launch goes to @stream's device, which must be the calling
 * thread's current device (a CUDA rule for kernel launches; the CUDA backend sees to it).
 * @cuda_error: may be NULL; else the cudaError_t of a failed launch (0 otherwise).
 * Returns 0 (n 0 queues nothing), -EINVAL (v NULL with n > 0, a NULL address),
 * KVT_EDEVICE (launch failure, CUDA's message kept; launches of earlier chunks stay queued).
 * Thread-safe (cudaLaunchKernel, no shared state).
 */
int kvt_copy_batch_cuda(const struct kvt_cuda_copy *v, uint32_t n, kvt_cuda_stream_t stream,
			int *cuda_error);

/**
 * kvt_quant_cuda() - int8 / fp8 e4m3 quantization with one fp32 scale per group of @group
 * elements, as kvt_quant_ref() (kernels/quant.h) and with the same bytes. Device pointers:
 * @src [n_groups][group] of @src_t (F32/F16/BF16), @q [n_groups][group] bytes, @scales
 * [n_groups]. Returns 0 (n_groups 0 queues nothing), -EINVAL, KVT_EDEVICE.
 */
int kvt_quant_cuda(enum kvt_dtype qt, enum kvt_dtype src_t, const void *src, uint64_t n_groups,
		   uint32_t group, void *q, float *scales, kvt_cuda_stream_t stream);

/**
 * kvt_dequant_cuda() - the inverse, as kvt_dequant_ref(): device @dst [n_groups][group] of
 * @dst_t = q * scales[g]. Returns 0, -EINVAL, KVT_EDEVICE.
 */
int kvt_dequant_cuda(enum kvt_dtype qt, const void *q, const float *scales, uint64_t n_groups,
		     uint32_t group, enum kvt_dtype dst_t, void *dst, kvt_cuda_stream_t stream);

/* ---- helpers for tests and benchmarks (kernels/delay.cu) ---- */

/**
 * kvt_cuda_delay_fill() - a kernel that spins @delay_ns nanoseconds on the GPU, then sets
 * device bytes dst[0..len) to @byte. For ordering tests: the write really happens late.
 * Returns 0, -EINVAL (dst NULL, len 0), KVT_EDEVICE.
 */
int kvt_cuda_delay_fill(void *dst, uint64_t len, unsigned char byte, uint64_t delay_ns,
			kvt_cuda_stream_t stream);

/**
 * kvt_cuda_delay_copy() - spins @delay_ns, then copies device bytes src[0..len) to dst (not
 * overlapping): the read of src really happens late. Returns 0, -EINVAL, KVT_EDEVICE.
 */
int kvt_cuda_delay_copy(void *dst, const void *src, uint64_t len, uint64_t delay_ns,
			kvt_cuda_stream_t stream);

/**
 * kvt_cuda_read_bytes() - read device bytes src[0..len) once at full bandwidth (8 blocks per
 * SM, @n_sm of them), streaming; @sink is a device [1024] uint32 scratch that is almost never
 * written (it keeps the loads alive). src and len 16-byte aligned. Stands in for the weight
 * reads of a decode step in benchmarks. Returns 0, -EINVAL, KVT_EDEVICE.
 */
int kvt_cuda_read_bytes(const void *src, uint64_t len, uint32_t *sink, int n_sm,
			kvt_cuda_stream_t stream);


/*
 * Issue 17's decode kernels (kernels/sparse_linear.cu; plain first versions, not tuned): each
 * computes what its C reference in kernels/linear.h or kernels/sparse.h computes, with fp32
 * accumulation in another order (results within fp32 rounding; Quest summaries exactly), on
 * device pointers, asynchronously on @stream. The host checks the shapes, dtypes and counts it
 * can see (-EINVAL); the contents of device arrays (block and token lists strictly ascending
 * and inside the sequence, selected blocks present in pos) are the caller's to guarantee, as
 * the references check. Returns 0, -EINVAL or KVT_EDEVICE (launch failed).
 */

/** kvt_gdn_step_cuda() - kvt_gdn_step_ref() on the GPU (no scratch; k_dim <= 4096). */
int kvt_gdn_step_cuda(const struct kvt_gdn_shape *s, void *state, const float *q,
		      const float *k, const float *v, const float *g, const float *beta,
		      float *out, kvt_cuda_stream_t stream);

/** kvt_conv_step_cuda() - kvt_conv_step_ref() on the GPU; @bias may be NULL. */
int kvt_conv_step_cuda(const struct kvt_conv_shape *s, void *state, const float *x,
		       const float *weight, const float *bias, float *out,
		       kvt_cuda_stream_t stream);

/** kvt_attn_select_cuda_work_floats() - @work of the select launchers: n_heads * n_blocks * tpb. */
size_t kvt_attn_select_cuda_work_floats(uint32_t n_heads, uint32_t n_blocks, uint32_t tpb);

/**
 * kvt_attn_select_cuda() - kvt_attn_select_ref() on the GPU: one thread block per query head.
 * @blocks: device [n_blocks]; @work: device kvt_attn_select_cuda_work_floats() floats, not
 * shared by launches that may overlap; kv->table and kv->pos device pointers.
 */
int kvt_attn_select_cuda(const struct kvt_paged_kv *kv, const float *q, uint32_t n_heads,
			 uint64_t seq_len, const uint32_t *blocks, uint32_t n_blocks,
			 float *work, float *out, kvt_cuda_stream_t stream);

/** kvt_attn_latent_select_cuda() - kvt_attn_latent_select_ref() on the GPU (as above). */
int kvt_attn_latent_select_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
				const float *q_pe, uint32_t n_heads, uint64_t seq_len,
				const uint32_t *blocks, uint32_t n_blocks, float scale,
				float *work, float *out, kvt_cuda_stream_t stream);

/** kvt_quest_summary_cuda() - kvt_quest_summary_ref() on the GPU; @blocks a device array. */
int kvt_quest_summary_cuda(const struct kvt_paged_kv *kv, uint64_t seq_len,
			   const uint32_t *blocks, uint32_t n_blocks, float *summary,
			   kvt_cuda_stream_t stream);

/** kvt_quest_score_cuda() - kvt_quest_score_ref() on the GPU. */
int kvt_quest_score_cuda(const float *summary, uint32_t n_blocks, uint32_t n_kv_heads,
			 uint32_t head_dim, const float *q, uint32_t n_heads, float *scores,
			 kvt_cuda_stream_t stream);

/** kvt_attn_latent_tokens_cuda_work_floats() - @work of the token-list launcher: heads * tokens. */
size_t kvt_attn_latent_tokens_cuda_work_floats(uint32_t n_heads, uint32_t n_tokens);

/**
 * kvt_attn_latent_tokens_partial_cuda() - kvt_attn_latent_tokens_partial_ref() on the GPU: the
 * split-KV partial of MLA's absorbed attention over DSA's selected tokens (masked inside blocks).
 * @kv:       host struct; base, table (and pos) device pointers; base, block_stride and
 *            token_stride multiples of the element size. window and sink ignored.
 * @q_lat:    device [n_heads][kv_lora_rank] fp32; @q_pe device [n_heads][rope_dim] fp32 (may
 *            be NULL when rope_dim is 0).
 * @tokens:   device [n_tokens] positions, strictly ascending, each < kv->seq_len when that is
 *            set, each one's block in pos (the caller's to guarantee, as the reference checks);
 *            may be NULL when n_tokens is 0.
 * @n_tokens: 0 writes the empty partial (out 0, m -INFINITY, l 0) and reads no K/V.
 * @work:     device kvt_attn_latent_tokens_cuda_work_floats(n_heads, n_tokens) floats (may be
 *            NULL when n_tokens is 0); not shared by launches that may overlap.
 * @out:      device [n_heads][kv_lora_rank]; @m, @l device [n_heads].
 * Launch: one thread block of 128 threads per query head (each re-reads the listed rows; not
 * tuned); scores are sequential dot products as the reference's, the exponentials' sum a tree.
 * fp32 accumulation; the tests bound max |got - want| / max |want| of out, m and l by 1e-5.
 * A token past kv->seq_len or whose block is missing from pos makes out, m and l NaN (no read
 * outside the arrays); pos not strictly ascending is not detected.
 * Returns 0, -EINVAL (the reference's host-visible checks: a NULL pointer, a zero dimension,
 * token_stride below one vector, bad dtype or scale, pos with n_entries 0 when n_tokens > 0;
 * plus misaligned base or strides, NULL @work with n_tokens > 0), KVT_EDEVICE (launch failed).
 */
int kvt_attn_latent_tokens_partial_cuda(const struct kvt_paged_latent *kv, const float *q_lat,
					const float *q_pe, uint32_t n_heads,
					const uint32_t *tokens, uint32_t n_tokens, float scale,
					float *work, float *out, float *m, float *l,
					kvt_cuda_stream_t stream);

/**
 * kvt_dsa_index_scores_cuda() - kvt_dsa_index_scores_ref() on the GPU: device @q
 * [n_heads][head_dim], @w [n_heads], @keys [n][key_stride] floats, @scores [n]. One thread per
 * key (128-thread blocks, grid-stride, at most 65535 blocks), the reference's summation order;
 * q and w staged in shared memory when n_heads * (head_dim + 1) <= 12288 floats. The tests
 * bound max |got - want| / max |want| by 1e-6. n 0 queues nothing (keys may then be NULL).
 * Returns 0, -EINVAL (as the reference: a NULL pointer, a zero dimension, key_stride <
 * head_dim), KVT_EDEVICE (launch failed).
 */
int kvt_dsa_index_scores_cuda(const float *q, const float *w, uint32_t n_heads,
			      uint32_t head_dim, float scale, const float *keys,
			      uint64_t key_stride, uint64_t n, float *scores,
			      kvt_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_KERNELS_CUDA_H */
