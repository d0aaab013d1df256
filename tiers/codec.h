/* SPDX-License-Identifier: MIT */
/*
 * tiers/codec.h - the lossless block codec of the NVMe path (internal).
 *
 * KV blocks are arrays of f32/f16/bf16 elements. Their low mantissa bits are noise, but the sign
 * and exponent bits of neighbouring elements are nearly constant, so:
 *   KVT_CODEC_LZ4        plain LZ4 of the bytes (a reference: gains ~nothing on real KV);
 *   KVT_CODEC_SHUF_LZ4   bit-plane shuffle, then LZ4: groups of 8 elements are transposed so that
 *                        bit b of every element lands in plane b (planes of the most significant
 *                        byte first: sign, exponent, then mantissa), each plane contiguous over the
 *                        whole block; LZ4 then matches the long near-constant exponent runs;
 *   KVT_CODEC_BYTE_LZ4   byte-plane shuffle (byte k of every element together), then LZ4: cheaper,
 *                        a coarser version of the same idea;
 *   KVT_CODEC_CSHUF_LZ4  channel-major Gray bit-plane shuffle, then LZ4 (recommended): every K or V
 *                        tile of the block ([tokens][n_kv_heads * head_dim]) is transposed to
 *                        [n_kv_heads * head_dim][tokens] so one channel's tokens sit together; the
 *                        exponent field of every 2- or 4-byte element is Gray-coded (a value
 *                        crossing a power of two, e.g. 1.9 -> 2.1, flips one exponent bit instead
 *                        of all eight, so the exponent planes stay near-constant); then the
 *                        bit-plane shuffle and LZ4 as KVT_CODEC_SHUF_LZ4. Needs the tile geometry
 *                        (struct kvt_codec_geom); without it (tokens < 2) there is no transpose.
 * The stored payload is exactly the LZ4 block (no header); the raw length and the codec are in
 * the block header on disk (tiers/tier_nvme.h). Encoding is kept only when it saves at least the
 * configured fraction; otherwise the caller stores the raw bytes (codec KVT_CODEC_NONE), so a
 * block is never stored larger than raw.
 *
 * Threading: the functions are pure (no global state) and may run on any thread concurrently,
 * each call with its own scratch buffer.
 */
#ifndef KVT_TIERS_CODEC_H
#define KVT_TIERS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/**
 * Tile geometry of a block for KVT_CODEC_CSHUF_LZ4 (the layout: a block is n_layers x {K, V}
 * tiles, each [tokens][row] elements). The block's whole tiles from its start are transposed;
 * elements after the last whole tile (none for a real block) stay in place.
 */
struct kvt_codec_geom {
	size_t elem;   /* element size in bytes (kvt_dtype_size of the layout's dtype) */
	size_t tokens; /* tokens per tile (tokens_per_block); < 2: no transpose */
	size_t row;    /* elements per token of a tile (n_kv_heads * head_dim); 0: no transpose */
};

/** Fill @g from a model layout (elem from dtype, tokens_per_block, n_kv_heads * head_dim). */
void kvt_codec_geom_of_layout(const struct kvt_layout *l, struct kvt_codec_geom *g);

/** Bytes of the scratch buffer a call needs for @raw_len bytes of input. */
size_t kvt_codec_scratch_bytes(size_t raw_len);

/** A short static name of @c ("none", "lz4", "shuf-lz4", "byte-lz4", "cshuf-lz4", "?"). */
const char *kvt_codec_name(int c);

/**
 * kvt_codec_encode() - compress @raw_len bytes of @src with codec @c.
 * @elem:    element size in bytes (1, 2 or 4); other sizes shuffle as bytes.
 * @dst:     receives the payload; @dst_cap bytes available.
 * @scratch: kvt_codec_scratch_bytes(raw_len) bytes, any alignment.
 * @min_saving: the encoding is kept only if stored <= raw_len * (1 - min_saving).
 * Returns the payload length (> 0) when kept, 0 when it did not pay (store raw), or -EINVAL
 * (unknown codec, NULL buffers, raw_len over 2 GiB).
 */
int64_t kvt_codec_encode(int c, size_t elem, const void *src, size_t raw_len, void *dst,
			 size_t dst_cap, void *scratch, double min_saving);

/**
 * kvt_codec_encode_geom() - kvt_codec_encode() with the tile geometry @g (elem taken from it);
 * the same returns. kvt_codec_encode() is this with no tiles ({elem, 0, 0}).
 */
int64_t kvt_codec_encode_geom(int c, const struct kvt_codec_geom *g, const void *src,
			      size_t raw_len, void *dst, size_t dst_cap, void *scratch,
			      double min_saving);

/**
 * kvt_codec_decode() - decompress a payload of @stored_len bytes into exactly @raw_len bytes.
 * Returns 0, KVT_ECORRUPT (the payload does not decode to exactly raw_len bytes; nothing is
 * promised about @dst then), or -EINVAL (unknown codec). The caller verifies the raw checksum.
 */
int kvt_codec_decode(int c, size_t elem, const void *src, size_t stored_len, void *dst,
		     size_t raw_len, void *scratch);

/** kvt_codec_decode() with the tile geometry @g the payload was encoded with. */
int kvt_codec_decode_geom(int c, const struct kvt_codec_geom *g, const void *src,
			  size_t stored_len, void *dst, size_t raw_len, void *scratch);

/** Chunk of the bit-plane shuffle: the planes are formed within each KVT_CODEC_CHUNK bytes. */
#define KVT_CODEC_CHUNK 16384u

/** Bit-plane shuffle of @n bytes (elements of @elem bytes) from @src to @dst (not overlapping),
 * chunk by chunk (KVT_CODEC_CHUNK bytes, the last one shorter); in a chunk, the bytes after the
 * last whole group of 8 elements are copied as they are. */
void kvt_bitshuffle(const void *src, void *dst, size_t n, size_t elem);
/** The inverse of kvt_bitshuffle. */
void kvt_bitunshuffle(const void *src, void *dst, size_t n, size_t elem);
/** KVT_CODEC_CSHUF_LZ4's shuffle of @n bytes from @src to @dst (not overlapping): whole tiles
 * of @g transposed, exponent fields Gray-coded (2- and 4-byte elements only), then
 * kvt_bitshuffle, chunk by chunk; element sizes other than 2 and 4: kvt_bitshuffle alone. */
void kvt_cshuffle(const struct kvt_codec_geom *g, const void *src, void *dst, size_t n);
/** The inverse of kvt_cshuffle. */
void kvt_cunshuffle(const struct kvt_codec_geom *g, const void *src, void *dst, size_t n);
/** Byte-plane shuffle / its inverse (same tail rule). */
void kvt_byteshuffle(const void *src, void *dst, size_t n, size_t elem);
void kvt_byteunshuffle(const void *src, void *dst, size_t n, size_t elem);

#endif /* KVT_TIERS_CODEC_H */
