/* SPDX-License-Identifier: MIT */
/*
 * engine/sidecar.c - a SIDECAR group's bytes in its parent's pool (issue 17 item 2;
 * engine/kvtier.h "SIDECAR groups", docs/ARCHITECTURE.md "SIDECAR groups").
 *
 * The sidecar is part of the parent's block: sc_len bytes at sc_off of every layer, after the
 * layer's K/V. So it is copied, demoted, checksummed, encoded, parked, stored, shared by prefix
 * and evicted with its block by the code that already does so for K/V: it can never be apart.
 * What this file adds is the mirror: per block record, a host copy of every layer's sidecar,
 * so that a caller scores blocks (an indexer's keys, a page summary) without bringing them up.
 *   - filled whenever a host-visible copy of the whole block appears (a demotion to HOST or a
 *     read from NVMe completed: engine/xfer.c), or when kvt_sc_read() reads the HOST or HBM
 *     copy of a block nobody is writing;
 *   - invalidated when the block is new or appended to (kvt_block_bump_ver): its bytes are
 *     being written and the caller's writes end only at the release;
 *   - gone with the record (the block left every tier).
 * With a summary (KVT_SUMMARY_K_MINMAX) nothing is added to the block and the mirror holds,
 * per layer, the Quest summary of the block's K (kvt_quest_summary_ref over its valid tokens)
 * instead of copied bytes: the same fill points compute it.
 * A block whose mirror is invalid and that has no HOST or HBM copy (only on NVMe, after a
 * restore or a prefix hit on a block whose mirror was never filled in this process) cannot be
 * read here: -EAGAIN, until a prepare brings it up once.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"
#include "kernels/sparse.h"

/* Bytes of one record's mirror (every layer). */
static uint64_t
sc_rec_bytes(const struct kvt_engine *e)
{
	return e->sc_rec * e->layout.n_layers;
}

void
kvt_sc_summarize(struct kvt_engine *e)
{
	e->sc_summary = true;
	e->sc_rec = kvt_quest_summary_floats(e->layout.n_kv_heads, e->layout.head_dim) *
		    sizeof(float);
}

int
kvt_sc_grow(struct kvt_engine *e, uint32_t c)
{
	uint8_t **nc;

	if (!e->sc_rec)
		return 0;
	if (c >= e->cap_bchunks)
		return kvt_err(-EINVAL, "sidecar mirror chunk %u past the chunk table", c);
	/* the chunk table of the mirror follows bchunk's capacity */
	nc = kvt_realloc(e->sc_chunk, (size_t)e->cap_bchunks * sizeof *nc);
	if (!nc)
		return kvt_err(-ENOMEM, "growing the sidecar mirror's chunk table");
	e->sc_chunk = nc;
	nc[c] = kvt_calloc(1, KVT_BCHUNK + (size_t)KVT_BCHUNK * sc_rec_bytes(e));
	if (!nc[c])
		return kvt_err(-ENOMEM, "a sidecar mirror chunk of %llu bytes",
			       (unsigned long long)(KVT_BCHUNK * sc_rec_bytes(e)));
	return 0;
}

/* The valid byte and the mirror bytes of record @id. */
static uint8_t *
sc_rec(const struct kvt_engine *e, uint32_t id, uint8_t **valid)
{
	uint8_t *c = e->sc_chunk[id >> KVT_BCHUNK_SHIFT];
	uint32_t k = id & (KVT_BCHUNK - 1);

	*valid = c + k;
	return c + KVT_BCHUNK + (size_t)k * sc_rec_bytes(e);
}

void
kvt_sc_invalidate(struct kvt_engine *e, uint32_t id)
{
	uint8_t *v;

	if (!e->sc_rec)
		return;
	(void)sc_rec(e, id, &v);
	*v = 0;
}

/* Block @id is being written (a write pin of its creator): its bytes are not final. */
static bool
sc_writing(struct kvt_engine *e, uint32_t id)
{
	const struct kvt_block *b = kvt_blk(e, id);
	const struct kvt_seqrec *s;
	uint32_t i;

	if (b->seq >= e->cap_seqs)
		return false;
	s = &e->seqs[b->seq];
	for (i = 0; i < s->n_wpins; i++)
		if (s->wpins[i] == id)
			return true;
	return false;
}

/* Tokens of block @id with contents: its creator's tokens in it, or a whole block (a cached
 * block is a full one). */
static uint32_t
sc_tokens(const struct kvt_engine *e, uint32_t id)
{
	const struct kvt_block *b = kvt_blk(e, id);
	uint32_t tpb = e->layout.tokens_per_block;
	uint64_t first = (uint64_t)b->index * tpb, n;

	if (b->seq >= e->cap_seqs || e->seqs[b->seq].n_tokens <= first)
		return tpb;
	n = e->seqs[b->seq].n_tokens - first;
	return n < tpb ? (uint32_t)n : tpb;
}

/* The mirror of block @id from @blk, a host copy of the whole block. */
static void
sc_fill_rec(struct kvt_engine *e, uint32_t id, const uint8_t *blk)
{
	uint8_t *v, *m = sc_rec(e, id, &v);
	uint32_t l, zero = 0;

	for (l = 0; l < e->layout.n_layers; l++) {
		const uint8_t *layer = blk + l * e->layer_block_bytes;

		if (e->sc_summary) {
			struct kvt_paged_kv kv;

			memset(&kv, 0, sizeof kv);
			kv.k_base = layer;
			kv.block_stride = e->block_bytes;
			kv.token_stride = e->token_bytes;
			kv.table = &zero;
			kv.tokens_per_block = e->layout.tokens_per_block;
			kv.n_kv_heads = e->layout.n_kv_heads;
			kv.head_dim = e->layout.head_dim;
			kv.dtype = e->layout.dtype;
			(void)kvt_quest_summary_ref(&kv, sc_tokens(e, id), &zero, 1,
						    (float *)(void *)(m + (size_t)l * e->sc_rec));
		} else {
			memcpy(m + (size_t)l * e->sc_rec, layer + e->sc_off, e->sc_len);
		}
	}
	*v = 1;
}

void
kvt_sc_fill(struct kvt_engine *e, uint32_t id, const void *blk)
{
	if (e->sc_rec && !sc_writing(e, id))
		sc_fill_rec(e, id, blk);
}

/* Block @id's mirror from its HBM copy, read whole through the device into sc_tmp (the lock
 * held: one copy, synchronous). */
static int
sc_fill_from_hbm(struct kvt_engine *e, uint32_t id)
{
	struct kvt_copy v;
	int rc;

	if (!e->sc_stream) {
		rc = e->dev->ops->stream_create(e->dev, &e->sc_stream);
		if (rc)
			return kvt_err(rc, "a stream for sidecar reads");
	}
	if (!e->sc_tmp && !(e->sc_tmp = kvt_malloc(e->block_bytes)))
		return kvt_err(-ENOMEM, "a block of %llu bytes for sidecar reads",
			       (unsigned long long)e->block_bytes);
	v.dst = e->sc_tmp;
	v.src = kvt_slot_addr(e, KVT_TIER_HBM, kvt_blk(e, id)->slot[KVT_TIER_HBM]);
	v.len = e->block_bytes;
	rc = e->dev->ops->copy_batch_async(e->dev, e->sc_stream, &v, 1);
	if (!rc)
		rc = e->dev->ops->stream_sync(e->dev, e->sc_stream);
	if (rc)
		return kvt_err(KVT_EDEVICE, "reading a block from HBM for its sidecar: %s",
			       kvt_strerror(rc));
	sc_fill_rec(e, id, e->sc_tmp);
	return 0;
}

int
kvt_sc_read(struct kvt_engine *e, kvt_seq_id id, uint32_t layer, uint32_t first, uint32_t n,
	    void *dst)
{
	struct kvt_seqrec *s;
	uint32_t idx, j;
	int rc = 0;

	kvt_lock(e);
	s = kvt_seq_lookup(e, id, &idx);
	if (!s) {
		rc = kvt_err(KVT_ECLOSED, "sequence %#llx is not open", (unsigned long long)id);
		goto out;
	}
	if (layer >= e->layout.n_layers) {
		rc = kvt_err(-EINVAL, "layer %u out of range (the group has %u)", layer,
			     e->layout.n_layers);
		goto out;
	}
	if ((uint64_t)first + n > s->n_blocks) {
		rc = kvt_err(-EINVAL, "blocks [%u, %llu) past the sequence's %u blocks", first,
			     (unsigned long long)first + n, s->n_blocks);
		goto out;
	}
	for (j = first; j < first + n; j++) {
		uint32_t b = s->blocks[j];
		struct kvt_block *blk;
		uint8_t *valid, *m;

		if (b == KVT_NIL) {
			rc = kvt_err(-ENOENT, "block %u left the sequence (out of its window)", j);
			goto out;
		}
		blk = kvt_blk(e, b);
		m = sc_rec(e, b, &valid);
		if (!*valid) {
			bool writing = sc_writing(e, b);

			if (kvt_copy_valid(blk, KVT_TIER_HOST) && !writing) {
				kvt_sc_fill(e, b, kvt_slot_addr(e, KVT_TIER_HOST,
								blk->slot[KVT_TIER_HOST]));
			} else if (kvt_copy_valid(blk, KVT_TIER_HBM)) {
				rc = sc_fill_from_hbm(e, b);
				if (rc)
					goto out;
				if (writing)
					*valid = 0; /* read now, not kept: the caller writes it */
			} else {
				rc = kvt_err(-EAGAIN, "block %u of the sequence is only on NVMe and its "
					     "sidecar was not read since this engine started or the "
					     "block was attached: prepare it once", j);
				goto out;
			}
		}
		memcpy((uint8_t *)dst + (size_t)(j - first) * e->sc_rec,
		       m + (size_t)layer * e->sc_rec, e->sc_rec);
	}
out:
	kvt_unlock(e);
	return rc;
}

void
kvt_sc_fini(struct kvt_engine *e)
{
	uint32_t c;

	kvt_free(e->sc_tmp);
	e->sc_tmp = NULL;
	if (!e->sc_chunk)
		return;
	for (c = 0; c < e->cap_blocks >> KVT_BCHUNK_SHIFT; c++)
		kvt_free(e->sc_chunk[c]);
	kvt_free(e->sc_chunk);
	e->sc_chunk = NULL;
}
