/* SPDX-License-Identifier: MIT */
/*
 * tiers/codec.c - bit-plane / byte-plane shuffles and LZ4 for NVMe blocks (see codec.h).
 *
 * The bit-plane shuffle works on groups of 8 elements: byte k of the 8 elements forms an 8x8 bit
 * matrix (one uint64), which is transposed (Hacker's Delight 7-3) so that byte i of the result
 * holds bit i of byte k of each of the 8 elements: one byte of plane (k, i). Group g writes byte g
 * of each plane; planes are ordered from the element's most significant byte down, so for
 * f16/bf16/f32 the sign and exponent planes come first. The transpose is its own inverse.
 */
#include <errno.h>
#include <string.h>

#include <lz4.h>

#include "engine/error.h"
#include "tiers/codec.h"

#define CODEC_MAX_RAW ((size_t)1 << 31) /* LZ4 takes int sizes */

size_t
kvt_codec_scratch_bytes(size_t raw_len)
{
	return raw_len;
}

const char *
kvt_codec_name(int c)
{
	switch (c) {
	case KVT_CODEC_NONE:
		return "none";
	case KVT_CODEC_LZ4:
		return "lz4";
	case KVT_CODEC_SHUF_LZ4:
		return "shuf-lz4";
	case KVT_CODEC_BYTE_LZ4:
		return "byte-lz4";
	default:
		return "?";
	}
}

/* Transpose the 8x8 bit matrix held in x (byte = row). */
static inline uint64_t
codec_t8(uint64_t x)
{
	uint64_t t;

	t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;
	x = x ^ t ^ (t << 7);
	t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull;
	x = x ^ t ^ (t << 14);
	t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull;
	x = x ^ t ^ (t << 28);
	return x;
}

/* Normalise the element size: 1, 2, 4 or 8 are shuffled as such, anything else as bytes. */
static size_t
codec_elem(size_t elem)
{
	return elem == 2 || elem == 4 || elem == 8 ? elem : 1;
}

void
kvt_bitshuffle(const void *src, void *dst, size_t n, size_t elem)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	size_t groups, g, k, i, gbytes;

	elem = codec_elem(elem);
	gbytes = 8 * elem;
	groups = n / gbytes;
	for (g = 0; g < groups; g++) {
		const uint8_t *e = s + g * gbytes;

		for (k = 0; k < elem; k++) {
			uint64_t x = 0;

			for (i = 0; i < 8; i++)
				x |= (uint64_t)e[i * elem + k] << (8 * i);
			x = codec_t8(x);
			/* plane p = (elem-1-k)*8 + (7-i): most significant byte and bit first */
			for (i = 0; i < 8; i++)
				d[((elem - 1 - k) * 8 + (7 - i)) * groups + g] = (uint8_t)(x >> (8 * i));
		}
	}
	memcpy(d + groups * gbytes, s + groups * gbytes, n - groups * gbytes);
}

void
kvt_bitunshuffle(const void *src, void *dst, size_t n, size_t elem)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	size_t groups, g, k, i, gbytes;

	elem = codec_elem(elem);
	gbytes = 8 * elem;
	groups = n / gbytes;
	for (g = 0; g < groups; g++) {
		uint8_t *e = d + g * gbytes;

		for (k = 0; k < elem; k++) {
			uint64_t x = 0;

			for (i = 0; i < 8; i++)
				x |= (uint64_t)s[((elem - 1 - k) * 8 + (7 - i)) * groups + g]
				     << (8 * i);
			x = codec_t8(x);
			for (i = 0; i < 8; i++)
				e[i * elem + k] = (uint8_t)(x >> (8 * i));
		}
	}
	memcpy(d + groups * gbytes, s + groups * gbytes, n - groups * gbytes);
}

void
kvt_byteshuffle(const void *src, void *dst, size_t n, size_t elem)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	size_t ne, j, k;

	elem = codec_elem(elem);
	ne = n / elem;
	for (k = 0; k < elem; k++)
		for (j = 0; j < ne; j++)
			d[(elem - 1 - k) * ne + j] = s[j * elem + k];
	memcpy(d + ne * elem, s + ne * elem, n - ne * elem);
}

void
kvt_byteunshuffle(const void *src, void *dst, size_t n, size_t elem)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	size_t ne, j, k;

	elem = codec_elem(elem);
	ne = n / elem;
	for (k = 0; k < elem; k++)
		for (j = 0; j < ne; j++)
			d[j * elem + k] = s[(elem - 1 - k) * ne + j];
	memcpy(d + ne * elem, s + ne * elem, n - ne * elem);
}

int64_t
kvt_codec_encode(int c, size_t elem, const void *src, size_t raw_len, void *dst, size_t dst_cap,
		 void *scratch, double min_saving)
{
	const void *in = src;
	double keep;
	size_t cap;
	int r;

	if (!src || !dst || !scratch || raw_len == 0 || raw_len >= CODEC_MAX_RAW)
		return kvt_err(-EINVAL, "codec: bad buffers or length %zu", raw_len);
	if (c == KVT_CODEC_NONE)
		return 0;
	if (c == KVT_CODEC_SHUF_LZ4)
		kvt_bitshuffle(src, scratch, raw_len, elem);
	else if (c == KVT_CODEC_BYTE_LZ4)
		kvt_byteshuffle(src, scratch, raw_len, elem);
	else if (c != KVT_CODEC_LZ4)
		return kvt_err(-EINVAL, "codec %d unknown", c);
	if (c != KVT_CODEC_LZ4)
		in = scratch;
	if (min_saving < 0)
		min_saving = 0;
	keep = (double)raw_len * (1.0 - min_saving);
	cap = keep < 1 ? 0 : (size_t)keep;
	if (cap >= raw_len)
		cap = raw_len - 1; /* never store larger than (or as large as) raw */
	if (cap > dst_cap)
		cap = dst_cap;
	if (cap == 0)
		return 0;
	/* LZ4 stops (returns 0) as soon as the output would pass cap: no wasted time there */
	r = LZ4_compress_default(in, dst, (int)raw_len, (int)cap);
	return r > 0 ? r : 0;
}

int
kvt_codec_decode(int c, size_t elem, const void *src, size_t stored_len, void *dst,
		 size_t raw_len, void *scratch)
{
	void *out = c == KVT_CODEC_LZ4 ? dst : scratch;
	int r;

	if (c == KVT_CODEC_NONE) {
		if (stored_len != raw_len)
			return kvt_err(KVT_ECORRUPT, "codec none: %zu bytes stored, %zu expected",
				       stored_len, raw_len);
		memcpy(dst, src, raw_len);
		return 0;
	}
	if (c != KVT_CODEC_LZ4 && c != KVT_CODEC_SHUF_LZ4 && c != KVT_CODEC_BYTE_LZ4)
		return kvt_err(-EINVAL, "codec %d unknown", c);
	if (stored_len == 0 || stored_len >= CODEC_MAX_RAW || raw_len >= CODEC_MAX_RAW)
		return kvt_err(KVT_ECORRUPT, "codec %s: bad lengths %zu -> %zu", kvt_codec_name(c),
			       stored_len, raw_len);
	r = LZ4_decompress_safe(src, out, (int)stored_len, (int)raw_len);
	if (r != (int)raw_len)
		return kvt_err(KVT_ECORRUPT, "codec %s: payload decodes to %d bytes, expected %zu",
			       kvt_codec_name(c), r, raw_len);
	if (c == KVT_CODEC_SHUF_LZ4)
		kvt_bitunshuffle(scratch, dst, raw_len, elem);
	else if (c == KVT_CODEC_BYTE_LZ4)
		kvt_byteunshuffle(scratch, dst, raw_len, elem);
	return 0;
}
