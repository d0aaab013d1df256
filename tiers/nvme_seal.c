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

#include "tiers/base/error.h"
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
 * Check a fully read slot: its header (in the staging buffer, or for a zero-copy get in the HOST
 * slot's header room), then the payload: a raw one by its checksum (in the staging buffer, then
 * copied to the caller's; in place when zero-copy), an encoded one decoded into the caller's
 * buffer, then verified. A get (want_lenc set) checks the header against the slot table's tag and
 * length code; a kvt_nvme_submit_read against the key (and stored length) given. @scratch: codec
 * scratch (kvt_codec_scratch_bytes), NULL = the tier's own (reaping thread). Needs no lock (reads
 * only @req and the tier's fixed fields). Returns 0, KVT_ECORRUPT or -ENOMEM.
 */
int
kvt_nvme_verify(struct kvt_nvme *n, const struct nvme_req *req, uint8_t *scratch)
{
	struct kvt_fmt_blkhdr h;
	uint32_t slot = req->slot;
	const uint8_t *hpage = req->whole ? req->data - NVME_HPAGE : req->buf;
	const uint8_t *payload = hpage + NVME_HPAGE;
	int rc;

	rc = kvt_fmt_blkhdr_decode(hpage, req->len, &h);
	if (rc != 0)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %s", slot, kvt_last_error_message());
	if (h.slot != slot)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: holds a block written to slot %u",
			       slot, h.slot);
	if (h.raw_len != n->block_bytes)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: block_bytes %u, expected %zu", slot,
			       h.raw_len, n->block_bytes);
	if (req->want_lenc) {
		/* a lost or misdirected write leaves another write's header here */
		if (!kvt_fmt_blkhdr_is(&h, req->want_tag, req->want_lenc, n->block_bytes))
			return kvt_err(KVT_ECORRUPT, "nvme slot %u: holds another write (tag %#x, "
				       "length code %#x; expected %#x, %#x)", slot,
				       kvt_fmt_write_tag(h.key),
				       kvt_fmt_lenc(h.codec, h.stored_len, n->block_bytes),
				       req->want_tag, req->want_lenc);
	} else if (h.key != req->key || (req->stored && h.stored_len != req->stored)) {
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: key %#llx with %u bytes stored, "
			       "expected %#llx with %u", slot, (unsigned long long)h.key,
			       h.stored_len, (unsigned long long)req->key, req->stored);
	}
	if (NVME_HPAGE + (size_t)h.stored_len > req->len)
		return kvt_err(KVT_ECORRUPT, "nvme slot %u: %u bytes stored, %u read", slot,
			       h.stored_len, req->len - NVME_HPAGE);
	if (h.codec == KVT_CODEC_NONE) {
		if (XXH3_64bits(payload, n->block_bytes) != h.sum)
			return kvt_err(KVT_ECORRUPT, "nvme slot %u: data checksum mismatch%s", slot,
				       req->whole ? " (zero-copy read)" : "");
		if (!req->whole)
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
