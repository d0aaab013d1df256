/* SPDX-License-Identifier: MIT */
/*
 * tests/test_codec.c - tiers/codec.c: the shuffles are exact inverses, every codec round-trips
 * every element size (with tails that are not whole groups), incompressible data is refused
 * (never stored larger than raw), min_saving is honoured, and damaged payloads are detected.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kvtier.h"
#include "tiers/codec.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t
rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* KV-like data: small floats of one sign and narrow exponent range, noisy mantissas, as
 * elements of @elem bytes (bf16/f16 keep the high half of an f32 bit pattern: close enough). */
static void
fill_kv(uint8_t *p, size_t n, size_t elem)
{
	for (size_t i = 0; i + elem <= n; i += elem) {
		uint32_t f = 0x3e000000u | (uint32_t)(rng() & 0x00ffffffu); /* 0.125..0.5 */

		if (rng() % 8 == 0)
			f |= 0x80000000u;
		if (elem == 4)
			memcpy(p + i, &f, 4);
		else if (elem == 2) {
			uint16_t h = (uint16_t)(f >> 16);

			memcpy(p + i, &h, 2);
		} else {
			p[i] = (uint8_t)(f >> 24);
		}
	}
	for (size_t i = n / elem * elem; i < n; i++)
		p[i] = (uint8_t)rng();
}

static void
test_shuffles_invert(void **state)
{
	static const size_t sizes[] = { 0, 1, 7, 8, 15, 16, 63, 64, 65, 1000, 4096, 12345,
					16384, 16385, 40007 }; /* several shuffle chunks */
	static const size_t elems[] = { 1, 2, 3, 4, 8 };
	uint8_t *a = malloc(40007), *b = malloc(40007), *c = malloc(40007);

	(void)state;
	for (size_t e = 0; e < sizeof elems / sizeof *elems; e++)
		for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
			size_t n = sizes[s];

			for (size_t i = 0; i < n; i++)
				a[i] = (uint8_t)rng();
			kvt_bitshuffle(a, b, n, elems[e]);
			kvt_bitunshuffle(b, c, n, elems[e]);
			assert_memory_equal(a, c, n);
			kvt_byteshuffle(a, b, n, elems[e]);
			kvt_byteunshuffle(b, c, n, elems[e]);
			assert_memory_equal(a, c, n);
		}
	free(a);
	free(b);
	free(c);
}

/* The sign bits of 16 f16 elements land together in the first plane. */
static void
test_bitshuffle_planes(void **state)
{
	uint16_t in[16];
	uint8_t out[32];

	(void)state;
	for (int i = 0; i < 16; i++)
		in[i] = (uint16_t)(i % 2 ? 0x8000u : 0x0001u);
	kvt_bitshuffle(in, out, sizeof in, 2);
	/* plane 0 (sign) has 2 bytes (2 groups): odd elements set; plane 15 (bit 0): even */
	assert_int_equal(out[0] | out[1] << 8, 0xaaaa);
	assert_int_equal(out[30] | out[31] << 8, 0x5555);
	for (int p = 2; p < 30; p++)
		assert_int_equal(out[p], 0);
}

static void
roundtrip(int codec, size_t elem, size_t n, bool expect_kept)
{
	uint8_t *raw = malloc(n), *enc = malloc(n), *dec = malloc(n), *scr = malloc(n);
	int64_t len;

	fill_kv(raw, n, elem);
	len = kvt_codec_encode(codec, elem, raw, n, enc, n, scr, 0.01);
	assert_true(len >= 0);
	assert_true((size_t)len < n);
	if (expect_kept)
		assert_true(len > 0);
	if (len > 0) {
		memset(dec, 0, n);
		assert_int_equal(kvt_codec_decode(codec, elem, enc, (size_t)len, dec, n, scr), 0);
		assert_memory_equal(raw, dec, n);
		/* a truncated payload does not decode to raw_len bytes */
		assert_int_equal(kvt_codec_decode(codec, elem, enc, (size_t)len - 1, dec, n, scr),
				 KVT_ECORRUPT);
		assert_int_equal(kvt_codec_decode(codec, elem, enc, (size_t)len, dec, n + 1, scr),
				 KVT_ECORRUPT);
	}
	free(raw);
	free(enc);
	free(dec);
	free(scr);
}

static void
test_roundtrips(void **state)
{
	(void)state;
	for (size_t n = 64; n <= 70000; n = n * 3 + 5) {
		roundtrip(KVT_CODEC_SHUF_LZ4, 2, n, n >= 4096);
		roundtrip(KVT_CODEC_SHUF_LZ4, 4, n, n >= 4096);
		roundtrip(KVT_CODEC_BYTE_LZ4, 2, n, false);
		roundtrip(KVT_CODEC_BYTE_LZ4, 4, n, false);
		roundtrip(KVT_CODEC_LZ4, 2, n, false);
	}
}

static void
test_incompressible_and_min_saving(void **state)
{
	size_t n = 65536;
	uint8_t *raw = malloc(n), *enc = malloc(n), *scr = malloc(n);

	(void)state;
	/* xorshift64* (top byte): the raw xorshift's low bytes of consecutive outputs are linearly
	 * related, which the Gray coding of cshuf-lz4 turns into repeated bit planes */
	for (size_t i = 0; i < n; i++)
		raw[i] = (uint8_t)((rng() * 0x2545F4914F6CDD1Dull) >> 56);
	for (int c = KVT_CODEC_LZ4; c <= KVT_CODEC_CSHUF_LZ4; c++)
		assert_int_equal(kvt_codec_encode(c, 2, raw, n, enc, n, scr, 0.0), 0);
	/* zeros compress to almost nothing: kept at 0.5, refused when asking for 0.99999 */
	memset(raw, 0, n);
	assert_true(kvt_codec_encode(KVT_CODEC_SHUF_LZ4, 2, raw, n, enc, n, scr, 0.5) > 0);
	assert_int_equal(kvt_codec_encode(KVT_CODEC_SHUF_LZ4, 2, raw, n, enc, n, scr, 0.99999), 0);
	assert_int_equal(kvt_codec_encode(KVT_CODEC_NONE, 2, raw, n, enc, n, scr, 0.1), 0);
	assert_int_equal(kvt_codec_encode(99, 2, raw, n, enc, n, scr, 0.1), -EINVAL);
	assert_int_equal(kvt_codec_decode(99, 2, enc, 10, raw, n, scr), -EINVAL);
	/* garbage payload */
	memset(enc, 0xff, 100);
	assert_int_equal(kvt_codec_decode(KVT_CODEC_LZ4, 2, enc, 100, raw, n, scr), KVT_ECORRUPT);
	free(raw);
	free(enc);
	free(scr);
}

/* Geometries of the channel-major shuffle: real-like, odd, one token (no transpose), none,
 * a tile wider than a shuffle chunk. */
static const struct {
	size_t tokens, row;
} geoms[] = { { 16, 32 }, { 3, 5 }, { 1, 7 }, { 0, 0 }, { 16, 1 }, { 2, 5000 } };

static void
test_cshuffle_invert(void **state)
{
	static const size_t sizes[] = { 0, 1, 7, 31, 64, 65, 1000, 1023, 1024, 1025, 16384, 16385,
					20000, 40007, 81920 };
	static const size_t elems[] = { 1, 2, 3, 4, 8 };
	size_t max = 81920;
	uint8_t *a = malloc(max), *b = malloc(max), *c = malloc(max);

	(void)state;
	for (size_t gi = 0; gi < sizeof geoms / sizeof *geoms; gi++)
		for (size_t e = 0; e < sizeof elems / sizeof *elems; e++)
			for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
				struct kvt_codec_geom g = { elems[e], geoms[gi].tokens,
							    geoms[gi].row };
				size_t n = sizes[s];

				for (size_t i = 0; i < n; i++)
					a[i] = (uint8_t)rng();
				memset(c, 0, n);
				kvt_cshuffle(&g, a, b, n);
				kvt_cunshuffle(&g, b, c, n);
				assert_memory_equal(a, c, n);
			}
	free(a);
	free(b);
	free(c);
}

/* The element transform before the bit planes is exactly the documented one: tile [t][c] at
 * [c][t], exponent field (bits 7..14 / 23..30) Gray-coded, elements past the whole tiles in
 * place and Gray-coded, a trailing partial element copied. */
static void
check_ctransform(size_t elem, size_t tokens, size_t row, size_t n)
{
	struct kvt_codec_geom g = { elem, tokens, row };
	uint8_t *a = malloc(n), *b = malloc(n), *t = malloc(n);
	size_t te = tokens * row, ne = n / elem, tiled = ne / te * te;
	unsigned lo = elem == 2 ? 7 : 23;

	for (size_t i = 0; i < n; i++)
		a[i] = (uint8_t)rng();
	kvt_cshuffle(&g, a, b, n);
	kvt_bitunshuffle(b, t, n, elem); /* back to the transformed elements */
	for (size_t i = 0; i < ne; i++) {
		size_t src = i;
		uint32_t x = 0, y = 0;

		if (i < tiled)
			src = i / te * te + i % te % tokens * row + i % te / tokens;
		memcpy(&x, a + src * elem, elem);
		memcpy(&y, t + i * elem, elem);
		assert_int_equal(y, x ^ ((x >> 1) & (0x7fu << lo)));
	}
	assert_memory_equal(a + ne * elem, t + ne * elem, n - ne * elem);
	free(a);
	free(b);
	free(t);
}

static void
test_cshuffle_layout(void **state)
{
	(void)state;
	check_ctransform(2, 3, 5, 2 * 15 * 2 + 2 + 1); /* 2 tiles, 1 element past, 1 byte */
	check_ctransform(4, 3, 5, 2 * 15 * 4 + 4 + 3);
	check_ctransform(2, 16, 32, 10240);           /* stories260K's bf16 block */
	check_ctransform(4, 16, 600, 4 * 16 * 600);   /* a tile over several chunks */
	check_ctransform(2, 2, 5000, 2 * 2 * 5000 * 2);
}

static void
test_cshuf_codec_roundtrips(void **state)
{
	(void)state;
	for (size_t gi = 0; gi < sizeof geoms / sizeof *geoms; gi++)
		for (size_t n = 64; n <= 70000; n = n * 3 + 5) {
			static const size_t elems[] = { 1, 2, 3, 4, 8 };

			for (size_t e = 0; e < sizeof elems / sizeof *elems; e++) {
				struct kvt_codec_geom g = { elems[e], geoms[gi].tokens,
							    geoms[gi].row };
				uint8_t *raw = malloc(n), *enc = malloc(n), *dec = malloc(n);
				uint8_t *scr = malloc(kvt_codec_scratch_bytes(n));
				int64_t len;

				fill_kv(raw, n, elems[e]);
				len = kvt_codec_encode_geom(KVT_CODEC_CSHUF_LZ4, &g, raw, n, enc,
							    n, scr, 0.0);
				assert_true(len >= 0 && (size_t)len < n);
				if ((elems[e] == 2 || elems[e] == 4) && n >= 4096)
					assert_true(len > 0); /* KV-like data compresses */
				if (len > 0) {
					assert_int_equal(kvt_codec_decode_geom(KVT_CODEC_CSHUF_LZ4,
									   &g, enc,
									   (size_t)len, dec,
									   n, scr),
							 0);
					assert_memory_equal(raw, dec, n);
					assert_int_equal(kvt_codec_decode_geom(
								 KVT_CODEC_CSHUF_LZ4, &g, enc,
								 (size_t)len - 1, dec, n, scr),
							 KVT_ECORRUPT);
				}
				free(raw);
				free(enc);
				free(dec);
				free(scr);
			}
		}
	assert_string_equal(kvt_codec_name(KVT_CODEC_CSHUF_LZ4), "cshuf-lz4");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shuffles_invert),
		cmocka_unit_test(test_bitshuffle_planes),
		cmocka_unit_test(test_roundtrips),
		cmocka_unit_test(test_incompressible_and_min_saving),
		cmocka_unit_test(test_cshuffle_invert),
		cmocka_unit_test(test_cshuffle_layout),
		cmocka_unit_test(test_cshuf_codec_roundtrips),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
