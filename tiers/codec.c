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
#include <stdbool.h>
#include <string.h>

#include <lz4.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "tiers/base/error.h"
#include "tiers/codec.h"

#define CODEC_MAX_RAW ((size_t)1 << 31) /* LZ4 takes int sizes */

void
kvt_codec_geom_of_layout(const struct kvt_layout *l, struct kvt_codec_geom *g)
{
	g->elem = kvt_dtype_size(l->dtype);
	g->tokens = l->tokens_per_block;
	g->row = (size_t)l->n_kv_heads * l->head_dim;
}

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
	case KVT_CODEC_CSHUF_LZ4:
		return "cshuf-lz4";
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

/* One group of 8 elements (index @g of @groups), scalar. */
static void
codec_bitshuffle_group(const uint8_t *s, uint8_t *d, size_t g, size_t groups, size_t elem)
{
	const uint8_t *e = s + g * 8 * elem;

	for (size_t k = 0; k < elem; k++) {
		uint64_t x = 0;

		for (size_t i = 0; i < 8; i++)
			x |= (uint64_t)e[i * elem + k] << (8 * i);
		x = codec_t8(x);
		/* plane p = (elem-1-k)*8 + (7-i): most significant byte and bit first */
		for (size_t i = 0; i < 8; i++)
			d[((elem - 1 - k) * 8 + (7 - i)) * groups + g] = (uint8_t)(x >> (8 * i));
	}
}

#if defined(__SSE2__)
/* Byte-plane @v (byte i = a byte of element i of 16) into the 8 bit planes of byte index @k:
 * movemask takes bit 7 of every byte, so planes come out most significant bit first, exactly
 * as the scalar transpose writes them (element j of a group at bit j). */
static inline void
codec_planes16(__m128i v, uint8_t *d, size_t k, size_t elem, size_t g, size_t groups)
{
	for (size_t b = 0; b < 8; b++) {
		uint16_t m = (uint16_t)_mm_movemask_epi8(v);

		memcpy(d + ((elem - 1 - k) * 8 + b) * groups + g, &m, 2);
		v = _mm_add_epi8(v, v);
	}
}

/* Groups g and g+1 (16 elements) of 2- or 4-byte elements with SSE2. */
static void
codec_bitshuffle16(const uint8_t *s, uint8_t *d, size_t g, size_t groups, size_t elem)
{
	const uint8_t *e = s + g * 8 * elem;

	if (elem == 2) {
		__m128i a = _mm_loadu_si128((const __m128i *)e);
		__m128i b = _mm_loadu_si128((const __m128i *)(e + 16));
		__m128i m = _mm_set1_epi16(0xff);

		codec_planes16(_mm_packus_epi16(_mm_and_si128(a, m), _mm_and_si128(b, m)), d, 0,
			       elem, g, groups);
		codec_planes16(_mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)), d, 1,
			       elem, g, groups);
		return;
	}
	__m128i a[4], m = _mm_set1_epi32(0xff);

	for (int i = 0; i < 4; i++)
		a[i] = _mm_loadu_si128((const __m128i *)(e + 16 * i));
	for (size_t k = 0; k < 4; k++) {
		__m128i w[4];

		__m128i sh = _mm_cvtsi32_si128((int)(8 * k));

		for (int i = 0; i < 4; i++)
			w[i] = _mm_and_si128(_mm_srl_epi32(a[i], sh), m);
		codec_planes16(_mm_packus_epi16(_mm_packs_epi32(w[0], w[1]),
						_mm_packs_epi32(w[2], w[3])),
			       d, k, elem, g, groups);
	}
}
#endif

/* The shuffles work chunk by chunk (KVT_CODEC_CHUNK bytes, the last one shorter): 16-32 plane
 * write streams over a whole 2 MiB block would sit 128 KiB apart and thrash the cache. */
static void codec_bitshuffle_chunk(const uint8_t *s, uint8_t *d, size_t n, size_t elem);
static void codec_bitunshuffle_chunk(const uint8_t *s, uint8_t *d, size_t n, size_t elem);

void
kvt_bitshuffle(const void *src, void *dst, size_t n, size_t elem)
{
	for (size_t off = 0, len; off < n; off += len) {
		len = n - off < KVT_CODEC_CHUNK ? n - off : KVT_CODEC_CHUNK;
		codec_bitshuffle_chunk((const uint8_t *)src + off, (uint8_t *)dst + off, len, elem);
	}
}

void
kvt_bitunshuffle(const void *src, void *dst, size_t n, size_t elem)
{
	for (size_t off = 0, len; off < n; off += len) {
		len = n - off < KVT_CODEC_CHUNK ? n - off : KVT_CODEC_CHUNK;
		codec_bitunshuffle_chunk((const uint8_t *)src + off, (uint8_t *)dst + off, len,
					 elem);
	}
}

static void
codec_bitshuffle_chunk(const uint8_t *s, uint8_t *d, size_t n, size_t elem)
{
	size_t groups, g = 0;

	elem = codec_elem(elem);
	groups = n / (8 * elem);
#if defined(__SSE2__)
	if (elem == 2 || elem == 4)
		for (; g + 1 < groups; g += 2)
			codec_bitshuffle16(s, d, g, groups, elem);
#endif
	for (; g < groups; g++)
		codec_bitshuffle_group(s, d, g, groups, elem);
	memcpy(d + groups * 8 * elem, s + groups * 8 * elem, n - groups * 8 * elem);
}

/* One group of 8 elements, scalar inverse. */
static void
codec_bitunshuffle_group(const uint8_t *s, uint8_t *d, size_t g, size_t groups, size_t elem)
{
	uint8_t *e = d + g * 8 * elem;

	for (size_t k = 0; k < elem; k++) {
		uint64_t x = 0;

		for (size_t i = 0; i < 8; i++)
			x |= (uint64_t)s[((elem - 1 - k) * 8 + (7 - i)) * groups + g] << (8 * i);
		x = codec_t8(x);
		for (size_t i = 0; i < 8; i++)
			e[i * elem + k] = (uint8_t)(x >> (8 * i));
	}
}

#if defined(__SSE2__)
/* The inverse of codec_planes16: byte i of the result = byte k of element i of 16. */
static inline __m128i
codec_unplanes16(const uint8_t *s, size_t k, size_t elem, size_t g, size_t groups)
{
	const __m128i sel = _mm_set_epi8((char)0x80, 0x40, 0x20, 0x10, 8, 4, 2, 1, (char)0x80,
					 0x40, 0x20, 0x10, 8, 4, 2, 1);
	__m128i acc = _mm_setzero_si128();

	for (size_t b = 0; b < 8; b++) {
		const uint8_t *p = s + ((elem - 1 - k) * 8 + b) * groups + g;
		__m128i m = _mm_set_epi64x((int64_t)(0x0101010101010101ull * p[1]),
					   (int64_t)(0x0101010101010101ull * p[0]));
		__m128i on = _mm_cmpeq_epi8(_mm_and_si128(m, sel), sel);

		acc = _mm_or_si128(acc, _mm_and_si128(on, _mm_set1_epi8((char)(0x80 >> b))));
	}
	return acc;
}

static void
codec_bitunshuffle16(const uint8_t *s, uint8_t *d, size_t g, size_t groups, size_t elem)
{
	uint8_t *e = d + g * 8 * elem;

	if (elem == 2) {
		__m128i lo = codec_unplanes16(s, 0, elem, g, groups);
		__m128i hi = codec_unplanes16(s, 1, elem, g, groups);

		_mm_storeu_si128((__m128i *)e, _mm_unpacklo_epi8(lo, hi));
		_mm_storeu_si128((__m128i *)(e + 16), _mm_unpackhi_epi8(lo, hi));
		return;
	}
	__m128i b0 = codec_unplanes16(s, 0, elem, g, groups);
	__m128i b1 = codec_unplanes16(s, 1, elem, g, groups);
	__m128i b2 = codec_unplanes16(s, 2, elem, g, groups);
	__m128i b3 = codec_unplanes16(s, 3, elem, g, groups);
	__m128i l01 = _mm_unpacklo_epi8(b0, b1), h01 = _mm_unpackhi_epi8(b0, b1);
	__m128i l23 = _mm_unpacklo_epi8(b2, b3), h23 = _mm_unpackhi_epi8(b2, b3);

	_mm_storeu_si128((__m128i *)e, _mm_unpacklo_epi16(l01, l23));
	_mm_storeu_si128((__m128i *)(e + 16), _mm_unpackhi_epi16(l01, l23));
	_mm_storeu_si128((__m128i *)(e + 32), _mm_unpacklo_epi16(h01, h23));
	_mm_storeu_si128((__m128i *)(e + 48), _mm_unpackhi_epi16(h01, h23));
}
#endif

static void
codec_bitunshuffle_chunk(const uint8_t *s, uint8_t *d, size_t n, size_t elem)
{
	size_t groups, g = 0;

	elem = codec_elem(elem);
	groups = n / (8 * elem);
#if defined(__SSE2__)
	if (elem == 2 || elem == 4)
		for (; g + 1 < groups; g += 2)
			codec_bitunshuffle16(s, d, g, groups, elem);
#endif
	for (; g < groups; g++)
		codec_bitunshuffle_group(s, d, g, groups, elem);
	memcpy(d + groups * 8 * elem, s + groups * 8 * elem, n - groups * 8 * elem);
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

/*
 * KVT_CODEC_CSHUF_LZ4's element transform, chunk by chunk: the transformed block is, element by
 * element, the Gray-coded source element at the transposed position. Gray coding of the exponent
 * field (bits lo..lo+7: 7..14 of a 2-byte element, 23..30 of a 4-byte one) is f ^ (f >> 1); for
 * f16 the field also covers the top 2 mantissa bits, which stays exact.
 */
struct codec_cpos {
	size_t i;     /* element index in the transformed block */
	size_t tile;  /* its tile */
	size_t c;     /* its channel in the tile */
	size_t t;     /* its token in the tile */
	size_t tiled; /* elements covered by whole tiles */
};

static void
codec_cpos_init(struct codec_cpos *p, const struct kvt_codec_geom *g, size_t n, size_t i)
{
	size_t te = g->tokens * g->row;

	p->i = i;
	p->tiled = g->tokens >= 2 && g->row ? n / g->elem / te * te : 0;
	p->tile = te ? i / te : 0;
	p->c = te ? i % te / g->tokens : 0;
	p->t = te ? i % te % g->tokens : 0;
}

/* Number of elements from p->i that map to consecutive tokens of one channel (stride row), or
 * to consecutive source elements (stride 1) past the tiles; the source index in *src. */
static size_t
codec_cpos_run(const struct codec_cpos *p, const struct kvt_codec_geom *g, size_t *src,
	       size_t *stride)
{
	if (p->i >= p->tiled) {
		*src = p->i;
		*stride = 1;
		return SIZE_MAX;
	}
	*src = p->tile * g->tokens * g->row + p->t * g->row + p->c;
	*stride = g->row;
	return g->tokens - p->t;
}

/* Move @k elements on (k <= the run codec_cpos_run returned). */
static void
codec_cpos_advance(struct codec_cpos *p, const struct kvt_codec_geom *g, size_t k)
{
	bool tiled = p->i < p->tiled;

	p->i += k;
	if (!tiled)
		return;
	p->t += k;
	if (p->t == g->tokens) {
		p->t = 0;
		if (++p->c == g->row) {
			p->c = 0;
			p->tile++;
		}
	}
}

static inline uint32_t
codec_gray(uint32_t x, unsigned lo)
{
	return x ^ ((x >> 1) & (0x7fu << lo));
}

static inline uint32_t
codec_ungray(uint32_t x, unsigned lo)
{
	uint32_t f = (x >> lo) & 0xffu;

	f ^= f >> 1;
	f ^= f >> 2;
	f ^= f >> 4;
	return (x & ~(0xffu << lo)) | f << lo;
}

/* @run elements: forward (@fwd) from @blk at stride @st to @seq; or back. */
static void
codec_crun(uint8_t *blk, uint8_t *seq, size_t run, size_t st, size_t elem, bool fwd)
{
	size_t sb = st * elem;

	if (st == 1 && fwd)
		memcpy(seq, blk, run * elem);
	else if (st == 1)
		memcpy(blk, seq, run * elem);
	else if (elem == 2 && fwd)
		for (size_t k = 0; k < run; k++, blk += sb)
			memcpy(seq + k * 2, blk, 2);
	else if (elem == 2)
		for (size_t k = 0; k < run; k++, blk += sb)
			memcpy(blk, seq + k * 2, 2);
	else if (fwd)
		for (size_t k = 0; k < run; k++, blk += sb)
			memcpy(seq + k * 4, blk, 4);
	else
		for (size_t k = 0; k < run; k++, blk += sb)
			memcpy(blk, seq + k * 4, 4);
}

/* Gray-code (@fwd) or decode the exponent fields of @ne elements of 2 or 4 bytes in @p. */
static void
codec_gray_buf(uint8_t *p, size_t ne, size_t elem, bool fwd)
{
	unsigned lo = elem == 2 ? 7 : 23;
	size_t i = 0;

#if defined(__SSE2__)
	const __m128i m7 = elem == 2 ? _mm_set1_epi16(0x3f80) : _mm_set1_epi32(0x3f800000);
	const __m128i ff = elem == 2 ? _mm_set1_epi16(0xff) : _mm_set1_epi32(0xff);
	const __m128i fl = elem == 2 ? _mm_set1_epi16(0x7f80) : _mm_set1_epi32(0x7f800000);

	for (; (i + 16 / elem) <= ne; i += 16 / elem) {
		__m128i x = _mm_loadu_si128((const __m128i *)(p + i * elem)), f;

		if (fwd && elem == 2) {
			x = _mm_xor_si128(x, _mm_and_si128(_mm_srli_epi16(x, 1), m7));
		} else if (fwd) {
			x = _mm_xor_si128(x, _mm_and_si128(_mm_srli_epi32(x, 1), m7));
		} else if (elem == 2) {
			f = _mm_and_si128(_mm_srli_epi16(x, 7), ff);
			f = _mm_xor_si128(f, _mm_srli_epi16(f, 1));
			f = _mm_xor_si128(f, _mm_srli_epi16(f, 2));
			f = _mm_xor_si128(f, _mm_srli_epi16(f, 4));
			x = _mm_or_si128(_mm_andnot_si128(fl, x), _mm_slli_epi16(f, 7));
		} else {
			f = _mm_and_si128(_mm_srli_epi32(x, 23), ff);
			f = _mm_xor_si128(f, _mm_srli_epi32(f, 1));
			f = _mm_xor_si128(f, _mm_srli_epi32(f, 2));
			f = _mm_xor_si128(f, _mm_srli_epi32(f, 4));
			x = _mm_or_si128(_mm_andnot_si128(fl, x), _mm_slli_epi32(f, 23));
		}
		_mm_storeu_si128((__m128i *)(p + i * elem), x);
	}
#endif
	for (; i < ne; i++) {
		uint32_t x = 0;

		memcpy(&x, p + i * elem, elem);
		x = fwd ? codec_gray(x, lo) : codec_ungray(x, lo);
		memcpy(p + i * elem, &x, elem);
	}
}

#if defined(__SSE2__)
/* Transpose the 8x8 matrix of 16-bit elements in r[0..7] (row i = r[i]) in place. */
static inline void
codec_t8x8_16(__m128i r[8])
{
	__m128i a[8], b[8];

	for (int i = 0; i < 4; i++) {
		a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
		a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
	}
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++) {
			b[4 * i + j] = _mm_unpacklo_epi32(a[4 * i + j], a[4 * i + j + 2]);
			b[4 * i + j + 2] = _mm_unpackhi_epi32(a[4 * i + j], a[4 * i + j + 2]);
		}
	/* b[0..3]: rows 0-3, columns (0,1) (4,5) (2,3) (6,7); b[4..7]: rows 4-7 likewise */
	static const int col[4] = { 0, 4, 2, 6 };

	for (int j = 0; j < 4; j++) {
		r[col[j]] = _mm_unpacklo_epi64(b[j], b[j + 4]);
		r[col[j] + 1] = _mm_unpackhi_epi64(b[j], b[j + 4]);
	}
}

/* Transpose the 4x4 matrix of 32-bit elements in r[0..3] in place. */
static inline void
codec_t4x4_32(__m128i r[4])
{
	__m128i a0 = _mm_unpacklo_epi32(r[0], r[1]), a1 = _mm_unpackhi_epi32(r[0], r[1]);
	__m128i a2 = _mm_unpacklo_epi32(r[2], r[3]), a3 = _mm_unpackhi_epi32(r[2], r[3]);

	r[0] = _mm_unpacklo_epi64(a0, a2);
	r[1] = _mm_unpackhi_epi64(a0, a2);
	r[2] = _mm_unpacklo_epi64(a1, a3);
	r[3] = _mm_unpackhi_epi64(a1, a3);
}

/* A stripe of w = 16 / elem channels x all tokens of a tile with SSE2, @blk at the stripe's
 * first element (token 0, channel c), @seq the stripe's place in the chunk buffer. */
static void
codec_cstripe(uint8_t *blk, uint8_t *seq, const struct kvt_codec_geom *g, bool fwd)
{
	size_t w = 16 / g->elem, rb = g->row * g->elem, tb = g->tokens * g->elem;
	__m128i r[8];

	for (size_t t = 0; t < g->tokens; t += w) {
		for (size_t i = 0; i < w; i++)
			r[i] = fwd ? _mm_loadu_si128((const __m128i *)(blk + (t + i) * rb))
				   : _mm_loadu_si128((const __m128i *)(seq + i * tb + t * g->elem));
		if (w == 8)
			codec_t8x8_16(r);
		else
			codec_t4x4_32(r);
		for (size_t i = 0; i < w; i++) {
			if (fwd)
				_mm_storeu_si128((__m128i *)(seq + i * tb + t * g->elem), r[i]);
			else
				_mm_storeu_si128((__m128i *)(blk + (t + i) * rb), r[i]);
		}
	}
}
#endif

/* One chunk: elements [i0, i0 + ne) of the transposed block (n bytes), from the block @in to
 * @tmp (@fwd), or from @tmp into the block @out. Whole stripes of 16 bytes of channels go
 * through SSE2 transposes when the geometry allows, the rest element by element. */
static void
codec_ctransform(const struct kvt_codec_geom *g, size_t n, size_t i0, size_t ne,
		 const uint8_t *in, uint8_t *out, uint8_t *tmp, bool fwd)
{
	/* reads only when fwd: the cast lets one helper serve both directions */
	uint8_t *blk = fwd ? (uint8_t *)(uintptr_t)in : out;
	size_t w = 16 / g->elem;
	struct codec_cpos p;
	size_t done = 0;

	codec_cpos_init(&p, g, n, i0);
	while (done < ne) {
		size_t src, stride, run = codec_cpos_run(&p, g, &src, &stride);

#if defined(__SSE2__)
		if (stride > 1 && p.t == 0 && p.c % w == 0 && g->tokens % w == 0 &&
		    g->row % w == 0 && ne - done >= w * g->tokens) {
			codec_cstripe(blk + src * g->elem, tmp + done * g->elem, g, fwd);
			done += w * g->tokens;
			p.i += w * g->tokens;
			p.c += w;
			if (p.c == g->row) {
				p.c = 0;
				p.tile++;
			}
			continue;
		}
#endif
		if (run > ne - done)
			run = ne - done;
		codec_crun(blk + src * g->elem, tmp + done * g->elem, run, stride, g->elem, fwd);
		done += run;
		codec_cpos_advance(&p, g, run);
	}
}

/* KVT_CODEC_CSHUF_LZ4's shuffle: @src (n bytes) -> @dst, or its inverse (@fwd false: @src is
 * the shuffled form, @dst receives the block). Other element sizes than 2 and 4: the bit-plane
 * shuffle alone. */
static void
codec_cshuffle(const struct kvt_codec_geom *g, const uint8_t *src, uint8_t *dst, size_t n,
	       bool fwd)
{
	uint8_t tmp[KVT_CODEC_CHUNK];

	if (g->elem != 2 && g->elem != 4) {
		if (fwd)
			kvt_bitshuffle(src, dst, n, g->elem);
		else
			kvt_bitunshuffle(src, dst, n, g->elem);
		return;
	}
	for (size_t off = 0, len; off < n; off += len) {
		size_t cne;

		len = n - off < KVT_CODEC_CHUNK ? n - off : KVT_CODEC_CHUNK;
		cne = len / g->elem; /* off is a multiple of elem: whole elements of the chunk */
		if (fwd) {
			codec_ctransform(g, n, off / g->elem, cne, src, NULL, tmp, true);
			codec_gray_buf(tmp, cne, g->elem, true);
			memcpy(tmp + cne * g->elem, src + off + cne * g->elem, len - cne * g->elem);
			codec_bitshuffle_chunk(tmp, dst + off, len, g->elem);
		} else {
			codec_bitunshuffle_chunk(src + off, tmp, len, g->elem);
			codec_gray_buf(tmp, cne, g->elem, false);
			codec_ctransform(g, n, off / g->elem, cne, NULL, dst, tmp, false);
			memcpy(dst + off + cne * g->elem, tmp + cne * g->elem, len - cne * g->elem);
		}
	}
}

void
kvt_cshuffle(const struct kvt_codec_geom *g, const void *src, void *dst, size_t n)
{
	struct kvt_codec_geom ng = { codec_elem(g->elem), g->tokens, g->row };

	codec_cshuffle(&ng, src, dst, n, true);
}

void
kvt_cunshuffle(const struct kvt_codec_geom *g, const void *src, void *dst, size_t n)
{
	struct kvt_codec_geom ng = { codec_elem(g->elem), g->tokens, g->row };

	codec_cshuffle(&ng, src, dst, n, false);
}

int64_t
kvt_codec_encode(int c, size_t elem, const void *src, size_t raw_len, void *dst, size_t dst_cap,
		 void *scratch, double min_saving)
{
	struct kvt_codec_geom g = { elem, 0, 0 };

	return kvt_codec_encode_geom(c, &g, src, raw_len, dst, dst_cap, scratch, min_saving);
}

int64_t
kvt_codec_encode_geom(int c, const struct kvt_codec_geom *g, const void *src, size_t raw_len,
		      void *dst, size_t dst_cap, void *scratch, double min_saving)
{
	const void *in = src;
	size_t cap, elem;
	double keep;
	int r;

	if (!g || !src || !dst || !scratch || raw_len == 0 || raw_len >= CODEC_MAX_RAW)
		return kvt_err(-EINVAL, "codec: bad buffers or length %zu", raw_len);
	elem = codec_elem(g->elem);
	if (c == KVT_CODEC_NONE)
		return 0;
	if (c == KVT_CODEC_SHUF_LZ4) {
		kvt_bitshuffle(src, scratch, raw_len, elem);
	} else if (c == KVT_CODEC_BYTE_LZ4) {
		kvt_byteshuffle(src, scratch, raw_len, elem);
	} else if (c == KVT_CODEC_CSHUF_LZ4) {
		kvt_cshuffle(g, src, scratch, raw_len);
	} else if (c != KVT_CODEC_LZ4) {
		return kvt_err(-EINVAL, "codec %d unknown", c);
	}
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
	struct kvt_codec_geom g = { elem, 0, 0 };

	return kvt_codec_decode_geom(c, &g, src, stored_len, dst, raw_len, scratch);
}

int
kvt_codec_decode_geom(int c, const struct kvt_codec_geom *g, const void *src, size_t stored_len,
		      void *dst, size_t raw_len, void *scratch)
{
	void *out = c == KVT_CODEC_LZ4 ? dst : scratch;
	size_t elem;
	int r;

	if (!g || !src || !dst || (!scratch && c != KVT_CODEC_NONE && c != KVT_CODEC_LZ4))
		return kvt_err(-EINVAL, "codec: bad buffers");
	elem = codec_elem(g->elem);
	if (c == KVT_CODEC_NONE) {
		if (stored_len != raw_len)
			return kvt_err(KVT_ECORRUPT, "codec none: %zu bytes stored, %zu expected",
				       stored_len, raw_len);
		memcpy(dst, src, raw_len);
		return 0;
	}
	if (c < KVT_CODEC_LZ4 || c > KVT_CODEC_CSHUF_LZ4)
		return kvt_err(-EINVAL, "codec %d unknown", c);
	if (stored_len == 0 || stored_len >= CODEC_MAX_RAW || raw_len >= CODEC_MAX_RAW)
		return kvt_err(KVT_ECORRUPT, "codec %s: bad lengths %zu -> %zu", kvt_codec_name(c),
			       stored_len, raw_len);
	r = LZ4_decompress_safe(src, out, (int)stored_len, (int)raw_len);
	if (r != (int)raw_len)
		return kvt_err(KVT_ECORRUPT, "codec %s: payload decodes to %d bytes, expected %zu",
			       kvt_codec_name(c), r, raw_len);
	if (c == KVT_CODEC_SHUF_LZ4) {
		kvt_bitunshuffle(scratch, dst, raw_len, elem);
	} else if (c == KVT_CODEC_BYTE_LZ4) {
		kvt_byteunshuffle(scratch, dst, raw_len, elem);
	} else if (c == KVT_CODEC_CSHUF_LZ4) {
		kvt_cunshuffle(g, scratch, dst, raw_len);
	}
	return 0;
}
