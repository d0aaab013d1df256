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
 * A block whose mirror is invalid and that has no HOST or HBM copy (only on NVMe, after a
 * restore or a prefix hit on a block whose mirror was never filled in this process) cannot be
 * read here: -EAGAIN, until a prepare brings it up once.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"

/* Bytes of one record's mirror (every layer). */
static uint64_t
sc_rec_bytes(const struct kvt_engine *e)
{
	return e->sc_len * e->layout.n_layers;
}

int
kvt_sc_grow(struct kvt_engine *e, uint32_t c)
{
	uint8_t **nc;

	if (!e->sc_len)
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

	if (!e->sc_len)
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

void
kvt_sc_fill(struct kvt_engine *e, uint32_t id, const void *blk)
{
	uint8_t *v, *m;
	uint32_t l;

	if (!e->sc_len || sc_writing(e, id))
		return;
	m = sc_rec(e, id, &v);
	for (l = 0; l < e->layout.n_layers; l++)
		memcpy(m + (size_t)l * e->sc_len,
		       (const uint8_t *)blk + l * e->layer_block_bytes + e->sc_off, e->sc_len);
	*v = 1;
}

/* Read block @id's whole HBM copy into the mirror through the device (the lock held: a few
 * small copies, synchronous). */
static int
sc_fill_from_hbm(struct kvt_engine *e, uint32_t id)
{
	struct kvt_copy v[64];
	uint8_t *valid, *m = sc_rec(e, id, &valid);
	const uint8_t *src = kvt_slot_addr(e, KVT_TIER_HBM, kvt_blk(e, id)->slot[KVT_TIER_HBM]);
	uint32_t l = 0, n;
	int rc;

	if (!e->sc_stream) {
		rc = e->dev->ops->stream_create(e->dev, &e->sc_stream);
		if (rc)
			return kvt_err(rc, "a stream for sidecar reads");
	}
	while (l < e->layout.n_layers) {
		for (n = 0; n < 64 && l < e->layout.n_layers; n++, l++) {
			v[n].dst = m + (size_t)l * e->sc_len;
			v[n].src = src + l * e->layer_block_bytes + e->sc_off;
			v[n].len = e->sc_len;
		}
		rc = e->dev->ops->copy_batch_async(e->dev, e->sc_stream, v, n);
		if (!rc)
			rc = e->dev->ops->stream_sync(e->dev, e->sc_stream);
		if (rc)
			return kvt_err(KVT_EDEVICE, "reading a sidecar from HBM: %s", kvt_strerror(rc));
	}
	*valid = 1;
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
		memcpy((uint8_t *)dst + (size_t)(j - first) * e->sc_len,
		       m + (size_t)layer * e->sc_len, e->sc_len);
	}
out:
	kvt_unlock(e);
	return rc;
}

void
kvt_sc_fini(struct kvt_engine *e)
{
	uint32_t c;

	if (!e->sc_chunk)
		return;
	for (c = 0; c < e->cap_blocks >> KVT_BCHUNK_SHIFT; c++)
		kvt_free(e->sc_chunk[c]);
	kvt_free(e->sc_chunk);
	e->sc_chunk = NULL;
}
