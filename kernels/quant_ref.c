/* SPDX-License-Identifier: MIT */
/* kernels/quant_ref.c - C reference of the int8 / fp8 e4m3 KV quantization (kernels/quant.h). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tiers/base/error.h"
#include "kernels/attention.h"
#include "kernels/quant.h"

#define QUANT_INT8_MAX 127.0f
#define QUANT_E4M3_MAX 448.0f

uint8_t
kvt_f32_to_e4m3(float f)
{
	uint8_t sign = signbit(f) ? 0x80 : 0x00;
	float a = fabsf(f), r;
	int e;

	if (isnan(f))
		return 0x7f;
	if (a >= QUANT_E4M3_MAX)
		return sign | 0x7e; /* saturate (infinities too) */
	if (a < 0x1p-6f) /* subnormal: m * 2^-9; m == 8 is the smallest normal, code 0x08 */
		return sign | (uint8_t)rintf(a * 512.0f);
	(void)frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1): a = 1.m * 2^(e - 1) */
	e -= 1;
	r = ldexpf(a, -e); /* [1, 2), exact */
	int m = (int)rintf((r - 1.0f) * 8.0f); /* exact products, RNE */
	if (m == 8) {
		m = 0;
		e++;
	}
	return sign | (uint8_t)(((e + 7) << 3) | m); /* a < 448 keeps it <= 0x7e */
}

float
kvt_e4m3_to_f32(uint8_t v)
{
	int e = (v >> 3) & 15, m = v & 7;
	float a;

	if ((v & 0x7f) == 0x7f)
		return NAN;
	a = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
	return v & 0x80 ? -a : a;
}

int
kvt_quant_check(const char *what, enum kvt_dtype qt, enum kvt_dtype ft, const void *a,
		const void *b, const void *c, uint32_t group)
{
	if (!a || !b || !c || !group)
		return kvt_err(-EINVAL, "%s: NULL buffer or group of 0 elements", what);
	if (qt != KVT_DTYPE_INT8 && qt != KVT_DTYPE_FP8_E4M3)
		return kvt_err(-EINVAL, "%s: quantized type %d is not INT8 or FP8_E4M3", what,
			       (int)qt);
	if (ft != KVT_DTYPE_F32 && ft != KVT_DTYPE_F16 && ft != KVT_DTYPE_BF16)
		return kvt_err(-EINVAL, "%s: type %d is not F32, F16 or BF16", what, (int)ft);
	return 0;
}

int
kvt_quant_ref(enum kvt_dtype qt, enum kvt_dtype src_t, const void *src, uint64_t n_groups,
	      uint32_t group, void *q, float *scales)
{
	const size_t es = kvt_dtype_size(src_t);
	float x[256];
	int rc = kvt_quant_check("kvt_quant_ref", qt, src_t, src, q, scales, group);

	if (rc)
		return rc;
	for (uint64_t g = 0; g < n_groups; g++) {
		const char *in = (const char *)src + g * group * es;
		uint8_t *out = (uint8_t *)q + g * group;
		float amax = 0.0f, scale;

		for (uint32_t i = 0; i < group; i += 256) {
			uint32_t n = group - i < 256 ? group - i : 256;

			(void)kvt_load_f32(src_t, x, in + (size_t)i * es, n);
			for (uint32_t j = 0; j < n; j++)
				amax = fmaxf(amax, fabsf(x[j]));
		}
		scale = amax / (qt == KVT_DTYPE_INT8 ? QUANT_INT8_MAX : QUANT_E4M3_MAX);
		scales[g] = scale;
		for (uint32_t i = 0; i < group; i += 256) {
			uint32_t n = group - i < 256 ? group - i : 256;

			(void)kvt_load_f32(src_t, x, in + (size_t)i * es, n);
			for (uint32_t j = 0; j < n; j++) {
				float y = scale > 0.0f ? x[j] / scale : 0.0f;
				float r = fminf(fmaxf(rintf(y), -127.0f), 127.0f);

				out[i + j] = qt == KVT_DTYPE_INT8 ? (uint8_t)(int8_t)r
								  : kvt_f32_to_e4m3(y);
			}
		}
	}
	return 0;
}

int
kvt_dequant_ref(enum kvt_dtype qt, const void *q, const float *scales, uint64_t n_groups,
		uint32_t group, enum kvt_dtype dst_t, void *dst)
{
	const size_t es = kvt_dtype_size(dst_t);
	int rc = kvt_quant_check("kvt_dequant_ref", qt, dst_t, q, scales, dst, group);

	if (rc)
		return rc;
	for (uint64_t g = 0; g < n_groups; g++)
		for (uint32_t i = 0; i < group; i++) {
			uint8_t v = ((const uint8_t *)q)[g * group + i];
			float x = (qt == KVT_DTYPE_INT8 ? (float)(int8_t)v : kvt_e4m3_to_f32(v)) *
				  scales[g];

			(void)kvt_store_f32(dst_t, (char *)dst + (g * group + i) * es, &x, 1);
		}
	return 0;
}
