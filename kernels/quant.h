/* SPDX-License-Identifier: MIT */
/*
 * kernels/quant.h - optional int8 / fp8 (e4m3) KV quantization with one fp32 scale per group
 * (a group is any run of contiguous elements, e.g. one layer's K of one block, or one token's
 * head): C reference (kernels/quant_ref.c); the CUDA versions are in kernels/kernels_cuda.h.
 *
 * Quantize one group x[0..group): amax = max |x[i]| (fmaxf, so NaNs are ignored),
 * scale = amax / QMAX (QMAX 127 for int8, 448 for e4m3), then for each element
 * y = x[i] / scale (0 when scale is 0), int8: (int8)clamp(rintf(y), -127, 127);
 * e4m3: round-to-nearest-even with saturation to +-448 (CUDA's __NV_SATFINITE; NaN stays NaN).
 * Dequantize: x' = q * scale in fp32, stored as F32, F16 or BF16 (round-to-nearest-even).
 * Every step is exactly rounded, so the GPU gives the same bytes as this reference.
 * Error: |x' - x| <= scale / 2 (int8) or <= |x| / 16 + 2^-10 scale (e4m3), before the store.
 */
#ifndef KVT_KERNELS_QUANT_H
#define KVT_KERNELS_QUANT_H

#include <stdint.h>

#include "kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

/** e4m3 (OCP FP8, the CUDA __nv_fp8_e4m3 format) from fp32: RNE, saturating to +-448. */
uint8_t kvt_f32_to_e4m3(float f);
/** fp32 value of an e4m3 byte (exact; 0x7f and 0xff are NaN). */
float kvt_e4m3_to_f32(uint8_t v);

/**
 * kvt_quant_check() - the argument checks of every quantize / dequantize entry point (C
 * reference and CUDA launchers): @a, @b, @c (the buffers) not NULL, @group > 0, @qt INT8 or
 * FP8_E4M3, @ft (the unquantized side) F32, F16 or BF16. @what names the caller in the
 * message. Returns 0 or -EINVAL with a message. Pure (thread-safe).
 */
int kvt_quant_check(const char *what, enum kvt_dtype qt, enum kvt_dtype ft, const void *a,
		    const void *b, const void *c, uint32_t group);

/**
 * kvt_quant_ref() - quantize @n_groups groups of @group elements.
 * @qt:     KVT_DTYPE_INT8 or KVT_DTYPE_FP8_E4M3.
 * @src_t:  KVT_DTYPE_F32, F16 or BF16: the type of @src [n_groups][group].
 * @q:      out [n_groups][group] bytes.  @scales: out [n_groups] fp32.
 * Returns 0 or -EINVAL (NULL pointer, group 0, unsupported type), with a message.
 */
int kvt_quant_ref(enum kvt_dtype qt, enum kvt_dtype src_t, const void *src, uint64_t n_groups,
		  uint32_t group, void *q, float *scales);

/**
 * kvt_dequant_ref() - the inverse: dst [n_groups][group] of @dst_t (F32, F16 or BF16) =
 * q * scales[g]. Returns 0 or -EINVAL.
 */
int kvt_dequant_ref(enum kvt_dtype qt, const void *q, const float *scales, uint64_t n_groups,
		    uint32_t group, enum kvt_dtype dst_t, void *dst);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_QUANT_H */
