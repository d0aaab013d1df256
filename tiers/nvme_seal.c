/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme_seal.c - the NVME tier's CPU work around an IO: sealing a write (checksum, encoding,
 * the header page) before it is submitted and verifying a read (header, checksum, decoding)
 * once its bytes are in. Run inline by nvme_io.c or by a worker (nvme_work.c), without the
 * tier's lock. The contract is in tier_nvme.h, the state in nvme_int.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engine/error.h"
#include "tiers/codec.h"
#include "tiers/nvme_int.h"

/*
 * Fill @req's header page (the header, zeros: in its staging buffer, or for a one-IO put in the
 * HOST slot's header room in front of req->data), and unless the payload goes zero-copy
 * (req->data), its staging buffer's payload: the block @raw (encoded when that pays) at
 * NVME_HPAGE with zero padding to the IO length. @raw may be the staging buffer's payload area
 * itself (a worker); then @encbuf (block_bytes) receives the encoding first. A put's key is
 * derived from the checksum. Sets req->len, key, stored, codec, sum.
 */
void
kvt_nvme_seal(struct kvt_nvme *n, struct nvme_req *req, const void *raw,
	      const struct kvt_nvme_wmeta *m, uint8_t *scratch, uint8_t *encbuf)
{
	uint8_t *payload = req->buf + NVME_HPAGE;
	uint8_t *eout = raw == payload ? encbuf : payload;
	uint8_t *hpage = req->whole ? req->data - NVME_HPAGE : req->buf;
	struct kvt_fmt_blkhdr h;
	int64_t enc = 0;

	memset(&h, 0, sizeof h);
	h.sum = XXH3_64bits(raw, n->block_bytes);
	if (n->codec != KVT_CODEC_NONE && !req->data)
		enc = kvt_codec_encode_geom(n->codec, &n->geom, raw, n->block_bytes, eout,
					    n->block_bytes, scratch, n->min_saving);
	if (enc > 0) {
		if (eout != payload)
			memcpy(payload, eout, (size_t)enc);
		h.codec = (uint32_t)n->codec;
		h.stored_len = (uint32_t)enc;
	} else {
		if (raw != payload && !req->data)
			memcpy(payload, raw, n->block_bytes);
		h.codec = KVT_CODEC_NONE;
		h.stored_len = (uint32_t)n->block_bytes;
	}
	req->len = nvme_io_len(n, h.stored_len);
	if (!req->data)
		memset(payload + h.stored_len, 0, req->len - NVME_HPAGE - h.stored_len);
	memset(hpage + NVME_HDR, 0, NVME_HPAGE - NVME_HDR);
	h.slot = req->slot;
	h.key = req->tabled ? kvt_fmt_write_key(n->sb.epoch, req->slot, h.sum) : m->key;
	req->key = h.key;
	h.session = m->session;
	h.index = m->index;
	h.raw_len = (uint32_t)n->block_bytes;
	memcpy(h.hash, m->hash, sizeof h.hash);
	kvt_fmt_blkhdr_encode(&h, hpage);
	req->stored = h.stored_len;
	req->codec = h.codec;
	req->sum = h.sum;
}

/*
 * Check a fully read staging buffer: its header, then the payload decoded into the caller's
 * buffer (raw payloads are checked in the staging buffer first); a zero-copy read: the HOST slot
 * against the slot table. @scratch: codec scratch (kvt_codec_scratch_bytes), NULL = the tier's
 * own (reaping thread). Needs no lock (reads only @req and the tier's fixed fields). Returns 0,
 * KVT_ECORRUPT or -ENOMEM.
 */
int
kvt_nvme_verify(struct kvt_nvme *n, const struct nvme_req *req, uint8_t *scratch)
{
	struct kvt_fmt_blkhdr h;
	uint32_t slot = req->slot;
	const uint8_t *payload = req->buf + NVME_HPAGE;
	int rc;

	if (req->data) {
		/* zero-copy: no header read; the slot table's checksum decides */
		if (XXH3_64bits(req->data, n->block_bytes) != req->want_sum)
			return kvt_err(KVT_ECORRUPT, "nvme slot %u: data checksum mismatch "
				       "(zero-copy read)", slot);
		return 0;
	}
	rc = kvt_fmt_blkhdr_decode(req->buf, req->len, &h);
	if (rc != 0)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %s", slot, kvt_last_error_message());
	if (h.slot != slot)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: holds a block written to slot %u",
			       slot, h.slot);
	if (h.raw_len != n->block_bytes)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: block_bytes %u, expected %zu", slot,
			       h.raw_len, n->block_bytes);
	if (h.key != req->key)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: key %#llx, expected %#llx", slot,
			       (unsigned long long)h.key, (unsigned long long)req->key);
	if (req->tabled && h.sum != req->want_sum)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: checksum %#llx, expected %#llx", slot,
			       (unsigned long long)h.sum, (unsigned long long)req->want_sum);
	if ((req->stored && h.stored_len != req->stored) ||
	    NVME_HPAGE + (size_t)h.stored_len > req->len)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %u bytes stored, %u expected", slot,
			       h.stored_len, req->stored);
	if (h.codec == KVT_CODEC_NONE) {
		if (XXH3_64bits(payload, n->block_bytes) != h.sum)
			return kvt_err(KVT_ECORRUPT, "nvme slot %u: data checksum mismatch", slot);
		memcpy(req->dst, payload, n->block_bytes);
		return 0;
	}
	if (!scratch && !n->scratch &&
	    !(n->scratch = malloc(kvt_codec_scratch_bytes(n->block_bytes))))
		return kvt_err(-ENOMEM, "nvme slot %u: codec scratch", slot);
	rc = kvt_codec_decode_geom((int)h.codec, &n->geom, payload, h.stored_len,
				   req->dst, n->block_bytes, scratch ? scratch : n->scratch);
	if (rc != 0)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %s", slot, kvt_last_error_message());
	if (XXH3_64bits(req->dst, n->block_bytes) != h.sum)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: data checksum mismatch after decoding",
			       slot);
	return 0;
}
