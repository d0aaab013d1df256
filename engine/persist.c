/* SPDX-License-Identifier: MIT */
/*
 * engine/persist.c - parked sessions that survive a restart: publishing them in the persistent
 * NVMe store's journal, restoring them, listing and dropping them (kvtier.h, docs/FORMAT.md).
 *
 * Two-phase publish: a sequence with a session key parked to NVMe is marked pub_pending. Once
 * every one of its blocks has a valid NVMe copy (its write completed), kvt_persist_publish()
 * makes the store file durable (fdatasync: phase 1, data), then appends one PUT record per ready
 * session to the journal and makes it durable (phase 2, publish). Both are grouped: one pair of
 * fdatasyncs for all sessions that became ready in one poll. A crash before phase 2 leaves the
 * previous record (if any), whose blocks are checked against their headers at restore.
 *
 * Slots: at open, the NVMe slots of the published sessions are taken out of the allocator with
 * owner KVT_SLOT_STORED, so nothing overwrites them until the session is restored (the slots
 * become its blocks' copies), dropped, or given up to make room (kvt_persist_reclaim). Every slot
 * a record that may be durable names is marked in e->nvme_named; such a slot that loses its block
 * or its record becomes KVT_SLOT_PENDING and returns to the allocator only after the record that
 * supersedes its own is committed (persist_commit), so a crash can never find a durable record
 * naming a slot that was rewritten since.
 *
 * All functions need e->lock (the public ones take it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

#define PERSIST_NO_SEQ UINT32_MAX

uint32_t kvt_test_adopt_fail; /* engine_impl.h */

/* Mark the slots of @rec as named by a journal record that may be durable. */
static void
persist_name(struct kvt_engine *e, const struct kvt_store_sess *rec)
{
	for (uint32_t i = 0; i < rec->n_blocks; i++)
		if (rec->blocks[i].slot < e->slots[KVT_TIER_NVME].n_slots)
			e->nvme_named[rec->blocks[i].slot] = 1;
}

/* Queue the slots of @rec, whose record is about to be superseded, until that is committed. */
static int
persist_queue(struct kvt_engine *e, const struct kvt_store_sess *rec)
{
	uint32_t need = e->n_pend + rec->n_blocks;

	if (need > e->cap_pend) {
		uint32_t c = e->cap_pend ? e->cap_pend : 64;
		void *p;

		while (c < need)
			c *= 2;
		p = kvt_realloc(e->pend, (size_t)c * sizeof *e->pend);
		if (!p)
			return kvt_err(-ENOMEM, "store: %u pending slots", c);
		e->pend = p;
		e->cap_pend = c;
	}
	for (uint32_t i = 0; i < rec->n_blocks; i++)
		if (rec->blocks[i].slot != KVT_FMT_HOLE) /* a hole names no slot */
			e->pend[e->n_pend++] = rec->blocks[i].slot;
	return 0;
}

/* The queued slots from @from on lost their record (superseded): stored ones become pending. */
static void
persist_unstore(struct kvt_engine *e, uint32_t from)
{
	for (uint32_t i = from; i < e->n_pend; i++) {
		uint32_t sl = e->pend[i];

		if (sl < e->slots[KVT_TIER_NVME].n_slots &&
		    kvt_owner(e, KVT_TIER_NVME, sl) == KVT_SLOT_STORED)
			kvt_owner_set(e, KVT_TIER_NVME, sl, KVT_SLOT_PENDING);
	}
}

/* Record in the superblock how much of the journal is durable (hardening 11): made durable with
 * the store's next fdatasync; at open a journal shorter than that is reported as damage. */
static void
persist_note_journal(struct kvt_engine *e)
{
	uint64_t gen, len;

	kvt_store_durable(e->store, &gen, &len);
	if (kvt_nvme_note_journal(e->nvme, gen, len) != 0)
		kvt_engine_log(e, KVT_LOG_WARN, "store %s: recording the journal's durable length: "
			       "%s (a later truncation of the journal may go unnoticed)", e->nvme_dir,
			       kvt_last_error_message());
}

/*
 * Make the journal durable (kvt_store_commit), then release what the committed records
 * superseded: queued slots no live record names any more leave the named set, and those no
 * block uses go back to the allocator. Returns the slots freed, or a negative error (nothing
 * released: the old records may still be the durable ones).
 */
static int
persist_commit(struct kvt_engine *e)
{
	uint32_t n_slots = e->slots[KVT_TIER_NVME].n_slots, freed = 0, i;
	int rc = kvt_store_commit(e->store);

	if (rc)
		return rc;
	persist_note_journal(e);
	for (i = 0; i < e->n_pend; i++)
		if (e->pend[i] < n_slots)
			e->nvme_named[e->pend[i]] = 0;
	for (i = 0; i < kvt_store_count(e->store); i++)
		persist_name(e, kvt_store_at(e->store, i));
	for (i = 0; i < e->n_pend; i++) {
		uint32_t sl = e->pend[i];

		if (sl < n_slots && !e->nvme_named[sl] &&
		    kvt_owner(e, KVT_TIER_NVME, sl) == KVT_SLOT_PENDING) {
			kvt_owner_set(e, KVT_TIER_NVME, sl, KVT_NIL);
			kvt_slots_free(&e->slots[KVT_TIER_NVME], sl);
			freed++;
		}
	}
	e->n_pend = 0;
	return (int)freed;
}

/* Forget a restorable session: DEL record; its slots are freed by the next persist_commit. */
static int
persist_drop(struct kvt_engine *e, struct kvt_store_sess *rec)
{
	uint32_t from = e->n_pend;
	int rc = persist_queue(e, rec);

	if (rc == 0)
		rc = kvt_store_del(e->store, rec->key);
	if (rc == 0)
		persist_unstore(e, from);
	else
		e->n_pend = from;
	return rc;
}

int
kvt_persist_open(struct kvt_engine *e)
{
	uint32_t n = 0, cap = 0, *slots = NULL, i, b, dropped, invalid;
	struct kvt_fmt_limits lim = {
		.n_slots = kvt_nvme_n_slots(e->nvme),
		.tokens_per_block = e->layout.tokens_per_block,
		.block_bytes = e->block_bytes,
		.codec = (uint32_t)e->opts.nvme_codec,
	};
	struct kvt_store_sess *rec;
	const char *why;
	uint64_t at, orphan, ack_gen, ack_len, found;
	int rc;

	kvt_nvme_journal_known(e->nvme, &ack_gen, &ack_len);
	rc = kvt_store_open_acked(e->nvme_dir, kvt_nvme_store_id(e->nvme), &lim,
				  kvt_nvme_epoch(e->nvme) == 1, ack_gen, ack_len, &e->store);
	if (rc)
		return rc;
	invalid = kvt_store_invalid(e->store, &why);
	if (invalid)
		kvt_engine_log(e, KVT_LOG_WARN, "store %s/kvtier.journal: %u records verify but hold "
			       "fields out of range; their sessions were dropped (first: %s)",
			       e->nvme_dir, invalid, why);
	if (kvt_store_short(e->store, &found, &ack_len)) {
		char what[64] = "the journal is missing or empty";

		if (found)
			snprintf(what, sizeof what, "only %llu verify", (unsigned long long)found);
		kvt_engine_log(e, KVT_LOG_WARN, "store %s/kvtier.journal: %llu bytes of it were "
			       "acknowledged durable, %s (truncated, zeroed or replaced after its "
			       "fdatasync: damage, not a torn tail); sessions published in the lost "
			       "part are gone, %u restored from what verifies%s", e->nvme_dir,
			       (unsigned long long)ack_len, what, kvt_store_count(e->store),
			       found ? "; the journal as it was is kept as kvtier.journal.damaged" :
			       "");
	}
	persist_note_journal(e);
	at = kvt_store_damaged(e->store, &dropped, &orphan);
	if (at) {
		char where[40] = "in its header";

		if (at > 1)
			snprintf(where, sizeof where, "at byte %llu", (unsigned long long)at);
		kvt_engine_log(e, KVT_LOG_WARN, "store %s/kvtier.journal does not verify %s, with %u "
			       "valid records after it, not replayed (damage, or appends that a power "
			       "loss cut out of order before their sync); %u sessions restored from "
			       "before it; the journal as it was is kept as kvtier.journal.damaged",
			       e->nvme_dir, where, dropped, kvt_store_count(e->store));
	}
	if (orphan)
		kvt_engine_log(e, KVT_LOG_WARN, "store %s: its journal belonged to another store "
			       "(id %#llx), left by a crash while this one was created: replaced",
			       e->nvme_dir, (unsigned long long)orphan);
	for (i = 0; i < kvt_store_count(e->store); i++)
		cap += kvt_store_at(e->store, i)->n_blocks;
	slots = kvt_malloc((cap ? cap : 1) * sizeof *slots);
	e->nvme_named = kvt_calloc(e->slots[KVT_TIER_NVME].n_slots, 1);
	if (!slots || !e->nvme_named) {
		kvt_free(slots);
		return kvt_err(-ENOMEM, "store: %u slots", cap);
	}
	/* the journal's replay guarantees in-range slots, each named by one session or by
	 * several with the same write (a shared prefix block): taken once, while any names it */
	for (i = 0; i < kvt_store_count(e->store); i++) {
		rec = kvt_store_at(e->store, i);
		rec->open_seq = PERSIST_NO_SEQ;
		for (b = 0; b < rec->n_blocks; b++)
			if (rec->blocks[b].slot != KVT_FMT_HOLE &&
			    !e->nvme_named[rec->blocks[b].slot]) {
				e->nvme_named[rec->blocks[b].slot] = 1;
				slots[n++] = rec->blocks[b].slot;
			}
	}
	rc = kvt_slots_take(&e->slots[KVT_TIER_NVME], slots, n);
	for (i = 0; rc == 0 && i < n; i++)
		kvt_owner_set(e, KVT_TIER_NVME, slots[i], KVT_SLOT_STORED);
	kvt_free(slots);
	if (rc)
		return kvt_err(rc, "store: the journal's sessions claim slots twice");
	return 0;
}

void
kvt_persist_close(struct kvt_engine *e)
{
	if (!e->store)
		return;
	kvt_persist_publish(e);
	/* a clean close leaves the journal's exact durable length in the superblock */
	persist_note_journal(e);
	if (!kvt_nvme_sync_failed(e->nvme))
		(void)kvt_nvme_sync(e->nvme);
	kvt_store_close(e->store);
	e->store = NULL;
	kvt_free(e->nvme_named);
	e->nvme_named = NULL;
	kvt_free(e->slot_tenants);
	e->slot_tenants = NULL;
	e->slot_tenants_at = 0;
	kvt_free(e->pend);
	e->pend = NULL;
	e->n_pend = e->cap_pend = 0;
}

void
kvt_persist_parked(struct kvt_engine *e, struct kvt_seqrec *s)
{
	if (!e->store || !s->session_key)
		return;
	s->pub_pending = 1;
	e->pub_check = true;
}

void
kvt_persist_forget(struct kvt_engine *e, struct kvt_seqrec *s)
{
	struct kvt_store_sess *rec;

	s->pub_pending = 0;
	if (!e->store || !s->session_key)
		return;
	rec = kvt_store_find(e->store, s->session_key);
	/* its slots belong to its blocks; those the record names stay out of use (pending)
	 * until the DEL is committed */
	if (rec && rec->open_seq == (uint32_t)(s - e->seqs) && persist_drop(e, rec) != 0)
		kvt_engine_log(e, KVT_LOG_ERROR, "forgetting session %#llx: %s",
			       (unsigned long long)s->session_key, kvt_last_error_message());
}

void
kvt_persist_keep(struct kvt_engine *e, struct kvt_seqrec *s)
{
	struct kvt_store_sess *rec;

	s->pub_pending = 0;
	if (!e->store || !s->session_key)
		return;
	rec = kvt_store_find(e->store, s->session_key);
	/* the record (its last published park) becomes restorable; the slots it names stay out
	 * of use: those of blocks freed now become pending (kvt_slot_free), the others stay
	 * with the blocks that still use them (shared), where a restore finds them */
	if (rec && rec->open_seq == (uint32_t)(s - e->seqs))
		rec->open_seq = PERSIST_NO_SEQ;
}

/* Whether every block of @s has a completed, valid NVMe copy. */
static bool
persist_ready(struct kvt_engine *e, const struct kvt_seqrec *s)
{
	struct kvt_nvme_slotinfo si;

	for (uint32_t i = 0; i < s->n_blocks; i++) {
		const struct kvt_block *b;

		if (s->blocks[i] == KVT_NIL)
			continue; /* a hole (engine/window.c): the record names no slot for it */
		b = kvt_blk(e, s->blocks[i]);
		if (!kvt_copy_valid(b, KVT_TIER_NVME) ||
		    !kvt_nvme_slot_info(e->nvme, b->slot[KVT_TIER_NVME], &si))
			return false;
	}
	return true;
}

/* Phase 2 for one ready sequence: its PUT record. */
static int
persist_put(struct kvt_engine *e, uint32_t idx)
{
	struct kvt_seqrec *s = &e->seqs[idx];
	struct kvt_store_sess *old = kvt_store_find(e->store, s->session_key);
	struct kvt_fmt_blkref *refs;
	uint32_t from = e->n_pend;
	int rc;

	/* the slots of the record this one replaces stay out of use until it is committed */
	if (old && (rc = persist_queue(e, old)) != 0)
		return rc;
	refs = kvt_calloc(s->n_blocks ? s->n_blocks : 1, sizeof *refs);
	if (!refs)
		return kvt_err(-ENOMEM, "publishing a session of %u blocks", s->n_blocks);
	for (uint32_t i = 0; i < s->n_blocks; i++) {
		const struct kvt_block *b;
		struct kvt_nvme_slotinfo si = { 0 };

		if (s->blocks[i] == KVT_NIL) { /* out of the window: a hole (engine/window.c) */
			refs[i].slot = KVT_FMT_HOLE;
			if (i + 1 == kvt_seq_first_live(e, s) && s->tail_hashed)
				memcpy(refs[i].hash, kvt_win_tail(e, s), sizeof refs[i].hash);
			continue;
		}
		b = kvt_blk(e, s->blocks[i]);

		/* persist_ready found every entry (mu is the engine's: nothing changed since) */
		if (!kvt_nvme_slot_info(e->nvme, b->slot[KVT_TIER_NVME], &si)) {
			kvt_free(refs);
			e->n_pend = from;
			return kvt_err(-ENOENT, "publishing session %#llx: block %u has no completed "
				       "NVMe write", (unsigned long long)s->session_key, i);
		}
		refs[i].slot = b->slot[KVT_TIER_NVME];
		refs[i].tag = si.tag;
		refs[i].lenc = si.lenc;
		if (b->hashed)
			memcpy(refs[i].hash, b->hash, sizeof refs[i].hash); /* prefix key */
	}
	rc = kvt_store_put(e->store, s->session_key, s->tenant, s->priority, s->tokens,
			   s->n_tokens, refs, s->n_blocks, idx);
	kvt_free(refs);
	if (rc) {
		e->n_pend = from; /* the old record stays the live one */
		return rc;
	}
	persist_unstore(e, from);
	persist_name(e, kvt_store_find(e->store, s->session_key));
	return 0;
}

void
kvt_persist_publish(struct kvt_engine *e)
{
	uint32_t i, ready = 0;
	bool synced = false;
	int rc = 0, crc;

	e->pub_check = false;
	for (i = 0; i < e->cap_seqs; i++) {
		struct kvt_seqrec *s = &e->seqs[i];

		if (!s->open || !s->pub_pending)
			continue;
		if (!e->store || !s->parked) {
			s->pub_pending = 0; /* resumed (or appended) before its park completed */
			continue;
		}
		if (!persist_ready(e, s))
			continue;
		if (!synced) {
			rc = kvt_nvme_sync(e->nvme); /* phase 1: the data are durable */
			if (rc)
				break;
			synced = true;
		}
		rc = persist_put(e, i);
		if (rc)
			break;
		s->pub_pending = 0;
		ready++;
	}
	/* phase 2: the records are durable; also those put before a failure (they are no
	 * longer pending, so nothing else would commit them) */
	if (ready || e->n_pend) {
		crc = persist_commit(e);
		if (rc == 0 && crc < 0)
			rc = crc;
	}
	if (rc) {
		kvt_engine_log(e, KVT_LOG_ERROR, "publishing parked sessions: %s",
			       kvt_last_error_message());
		/* try again at the next poll, unless the store failed for good */
		e->pub_check = !kvt_store_failed(e->store) && !kvt_nvme_sync_failed(e->nvme);
	}
}

int
kvt_persist_reclaim(struct kvt_engine *e, uint32_t need)
{
	uint32_t freed = 0;
	int rc;

	if (!e->store)
		return 0;
	/* slots waiting for a superseding record to be committed: commit now */
	if (e->n_pend) {
		rc = persist_commit(e);
		if (rc > 0)
			freed += (uint32_t)rc;
	}
	while (freed < need) {
		struct kvt_store_sess *oldest = NULL;

		for (uint32_t i = 0; i < kvt_store_count(e->store); i++) {
			struct kvt_store_sess *r = kvt_store_at(e->store, i);

			if (r->open_seq == PERSIST_NO_SEQ && r->n_blocks &&
			    (!oldest || r->seqno < oldest->seqno))
				oldest = r;
		}
		if (!oldest)
			break;
		kvt_engine_log(e, KVT_LOG_WARN, "NVMe tier full: dropping stored session %#llx "
			       "(%u blocks)", (unsigned long long)oldest->key, oldest->n_blocks);
		if (persist_drop(e, oldest) != 0)
			break;
		/* its slots are reused only once its DEL is durable */
		rc = persist_commit(e);
		if (rc < 0)
			break;
		freed += (uint32_t)rc;
	}
	return (int)freed;
}

/* ---- public API --------------------------------------------------------------------------- */

#define PERSIST_ANY_TENANT UINT64_MAX /* kvt_session_list, kvt_session_drop: every tenant */

/* The restorable sessions of @tenant (PERSIST_ANY_TENANT: of every tenant) into @keys. */
static int
persist_list(struct kvt_engine *e, uint64_t tenant, uint64_t *keys, size_t cap)
{
	uint32_t n = 0;

	kvt_lock(e);
	for (uint32_t i = 0; e->store && i < kvt_store_count(e->store); i++) {
		struct kvt_store_sess *r = kvt_store_at(e->store, i);

		if (r->open_seq != PERSIST_NO_SEQ ||
		    (tenant != PERSIST_ANY_TENANT && r->tenant != tenant))
			continue;
		if (n < cap)
			keys[n] = r->key;
		n++;
	}
	kvt_unlock(e);
	return (int)n;
}

int
kvt_session_list(struct kvt_engine *e, uint64_t *keys, size_t cap)
{
	if (!e || (!keys && cap))
		return kvt_err(-EINVAL, "kvt_session_list: engine or keys is NULL");
	if (e->grp)
		return kvt_grp_session_list(e, true, 0, keys, cap);
	return persist_list(e, PERSIST_ANY_TENANT, keys, cap);
}

int
kvt_session_list_tenant(struct kvt_engine *e, uint32_t tenant, uint64_t *keys, size_t cap)
{
	if (!e || (!keys && cap))
		return kvt_err(-EINVAL, "kvt_session_list_tenant: engine or keys is NULL");
	if (e->grp)
		return kvt_grp_session_list(e, false, tenant, keys, cap);
	return persist_list(e, tenant, keys, cap);
}

/* The live block that already holds block @i of @rec as its NVMe copy (one a prefix attach made
 * from it, see kvt_persist_prefix), or KVT_NIL. */
static uint32_t
persist_holder(struct kvt_engine *e, const struct kvt_fmt_blkref *r)
{
	uint32_t id = kvt_owner(e, KVT_TIER_NVME, r->slot);
	struct kvt_nvme_slotinfo si;
	const struct kvt_block *b;

	if (!KVT_OWNER_IS_BLOCK(id) || id >= e->cap_blocks)
		return KVT_NIL;
	b = kvt_blk(e, id);
	if (!b->live || b->dead || b->slot[KVT_TIER_NVME] != r->slot ||
	    !kvt_nvme_slot_info(e->nvme, r->slot, &si) || si.tag != r->tag || si.lenc != r->lenc ||
	    !kvt_copy_valid(b, KVT_TIER_NVME))
		return KVT_NIL;
	return id;
}

/*
 * Whether the header @h (whose write, tag and length code, is the one block @i of @rec names) is
 * that block: written for this session at this index, or a block the session shares with the one
 * that wrote it (a prefix attach: the header carries its creator's session key and index), which
 * is then identified by its content hash, the prefix key both records and the header carry.
 */
static bool
persist_same_block(const struct kvt_store_sess *rec, uint32_t i, const struct kvt_fmt_blkhdr *h)
{
	static const uint8_t zero[16];
	const uint8_t *hash = rec->blocks[i].hash;

	if (h->session == rec->key)
		return h->index == i;
	return memcmp(hash, zero, sizeof zero) != 0 && memcmp(h->hash, hash, sizeof zero) == 0;
}

/* The tenant of live block @id: of the open sequences holding it (its creator first, then the
 * prefix index, then any holder). False when none is known. */
static bool
persist_block_tenant(struct kvt_engine *e, uint32_t id, uint32_t *tenant)
{
	const struct kvt_block *b = kvt_blk(e, id);
	const struct kvt_seqrec *s = b->seq < e->cap_seqs ? &e->seqs[b->seq] : NULL;

	if (s && s->open && b->index < s->n_blocks && s->blocks[b->index] == id) {
		*tenant = s->tenant;
		return true;
	}
	if (kvt_prefix_tenant(e, id, tenant))
		return true;
	for (uint32_t q = 0; q < e->cap_seqs; q++) {
		s = &e->seqs[q];
		for (uint32_t j = 0; s->open && j < s->n_blocks; j++)
			if (s->blocks[j] == id) {
				*tenant = s->tenant;
				return true;
			}
	}
	return false;
}

#define PERSIST_ST_NAMED (1ull << 63) /* e->slot_tenants: a stored session names the slot */
#define PERSIST_ST_MIXED (1ull << 62) /* ... and sessions of more than one tenant do */

/* e->slot_tenants for the store's sessions as they are now: rebuilt (linear in the store's
 * blocks) only when the index changed since, so a check is O(1). 0 or -ENOMEM. */
static int
persist_slot_tenants(struct kvt_engine *e)
{
	uint32_t n_slots = e->slots[KVT_TIER_NVME].n_slots;
	uint64_t at = kvt_store_changes(e->store) + 1;

	if (e->slot_tenants && e->slot_tenants_at == at)
		return 0;
	if (!e->slot_tenants && !(e->slot_tenants = kvt_calloc(n_slots, sizeof(uint64_t))))
		return kvt_err(-ENOMEM, "tenants of %u NVMe slots", n_slots);
	memset(e->slot_tenants, 0, (size_t)n_slots * sizeof(uint64_t));
	for (uint32_t k = 0; k < kvt_store_count(e->store); k++) {
		const struct kvt_store_sess *o = kvt_store_at(e->store, k);

		for (uint32_t j = 0; j < o->n_blocks; j++) {
			uint64_t *v;

			if (o->blocks[j].slot == KVT_FMT_HOLE)
				continue; /* a hole names no slot */
			v = &e->slot_tenants[o->blocks[j].slot];
			if (!(*v & PERSIST_ST_NAMED))
				*v = PERSIST_ST_NAMED | o->tenant;
			else if ((uint32_t)*v != o->tenant)
				*v |= PERSIST_ST_MIXED;
		}
	}
	e->slot_tenants_at = at;
	return 0;
}

/*
 * Whether block @i of @rec may be shared with whatever else holds its write: every stored
 * session naming the slot must be of @rec's tenant, and so must a live block already made from
 * it (@holder, or KVT_NIL). Blocks are never shared across tenants, whatever the journal says
 * (a forged record naming a block of another tenant's live record). 0, -EPERM (naming the
 * conflict) or -ENOMEM. O(1) (persist_slot_tenants) but for finding a holder's tenant.
 */
static int
persist_check_tenant(struct kvt_engine *e, const struct kvt_store_sess *rec, uint32_t i,
		     uint32_t holder)
{
	const struct kvt_fmt_blkref *r = &rec->blocks[i];
	uint32_t t;
	uint64_t v;
	int rc;

	if (holder != KVT_NIL && (!persist_block_tenant(e, holder, &t) || t != rec->tenant))
		return kvt_err(-EPERM, "block %u: slot %u is held in memory by block %u of "
			       "another tenant than %u: not shared", i, r->slot, holder, rec->tenant);
	rc = persist_slot_tenants(e);
	if (rc)
		return rc;
	v = e->slot_tenants[r->slot];
	if ((v & PERSIST_ST_MIXED) || ((v & PERSIST_ST_NAMED) && (uint32_t)v != rec->tenant))
		return kvt_err(-EPERM, "block %u: slot %u is also named by a stored session of "
			       "another tenant than %u: blocks are not shared across tenants", i,
			       r->slot, rec->tenant);
	return 0;
}

/* Check block @i of @rec: its slot untouched since (stored, or pending: kept out of use) with a
 * header that matches, or held by a live block made from it. A block shared with another
 * session (held in memory, or a header naming another session) must not be another tenant's
 * (persist_check_tenant). 0, -ENOENT, -EPERM or -EIO. */
static int
persist_check_one(struct kvt_engine *e, const struct kvt_store_sess *rec, uint32_t i)
{
	const struct kvt_fmt_blkref *r = &rec->blocks[i];
	uint32_t own = kvt_owner(e, KVT_TIER_NVME, r->slot);
	struct kvt_fmt_blkhdr h;
	int rc;

	if (own != KVT_SLOT_STORED && own != KVT_SLOT_PENDING) {
		uint32_t id = persist_holder(e, r);

		return id != KVT_NIL ? persist_check_tenant(e, rec, i, id) :
		       kvt_err(-ENOENT, "block %u: slot %u was reused", i, r->slot);
	}
	rc = kvt_nvme_read_header(e->nvme, r->slot, &h);
	if (rc == KVT_ECORRUPT)
		return kvt_err(-ENOENT, "block %u: %s", i, kvt_last_error_message());
	if (rc)
		return kvt_err(-EIO, "block %u: %s", i, kvt_last_error_message());
	if (!kvt_fmt_blkhdr_is(&h, r->tag, r->lenc, e->block_bytes) ||
	    h.raw_len != e->block_bytes || h.stored_len > e->block_bytes)
		return kvt_err(-ENOENT, "block %u: slot %u holds another write (tag %#x, "
			       "expected %#x)", i, r->slot, kvt_fmt_write_tag(h.key), r->tag);
	if (!persist_same_block(rec, i, &h))
		return kvt_err(-ENOENT, "block %u: slot %u holds block %u of session %#llx, not "
			       "this one nor a prefix block it shares", i, r->slot, h.index,
			       (unsigned long long)h.session);
	if (h.session != rec->key)
		return persist_check_tenant(e, rec, i, KVT_NIL);
	return 0;
}

/* The holes of @rec (blocks its sequence dropped out of its sliding window, engine/window.c),
 * after *first and up to *end (exclusive; both 0 when none). */
static void
persist_holes(const struct kvt_store_sess *rec, uint32_t *first, uint32_t *end)
{
	uint32_t i;

	*first = *end = 0;
	for (i = 0; i < rec->n_blocks && rec->blocks[i].slot != KVT_FMT_HOLE; i++)
		;
	if (i == rec->n_blocks)
		return;
	*first = i;
	while (i < rec->n_blocks && rec->blocks[i].slot == KVT_FMT_HOLE)
		i++;
	*end = i;
}

/* A session with holes restores only into an engine whose window would have dropped them:
 * one range right after the sinks, none that the next query (at n_tokens) reads. 0 or
 * -EINVAL (kvt_err). */
static int
persist_check_holes(struct kvt_engine *e, const struct kvt_store_sess *rec)
{
	uint32_t first, end, i;

	persist_holes(rec, &first, &end);
	if (first == end)
		return 0;
	for (i = end; i < rec->n_blocks; i++)
		if (rec->blocks[i].slot == KVT_FMT_HOLE)
			end = rec->n_blocks + 1; /* two ranges: not a window's */
	if (!e->win_tokens || first != kvt_win_sink_blocks(e) || end > rec->n_blocks ||
	    kvt_win_first_block(e, rec->n_tokens) < end)
		return kvt_err(-EINVAL, "session %#llx was stored by a sliding-window engine that "
			       "dropped blocks [%u, %u) of it; this engine (window %u, sink %u "
			       "tokens) would read them", (unsigned long long)rec->key, first,
			       end > rec->n_blocks ? rec->n_blocks : end, e->win_tokens,
			       e->win_sink);
	return 0;
}

/* Check every block of @rec (persist_check_one). 0, -ENOENT (mismatch), -EPERM (a block of
 * another tenant) or -EIO. */
static int
persist_check(struct kvt_engine *e, const struct kvt_store_sess *rec)
{
	int rc = persist_check_holes(e, rec);

	for (uint32_t i = 0; rc == 0 && i < rec->n_blocks; i++)
		if (rec->blocks[i].slot != KVT_FMT_HOLE) /* out of the window: nothing to check */
			rc = persist_check_one(e, rec, i);
	return rc;
}

/* A new block @i of sequence @seq whose only copy is the stored slot of @r. */
static int
persist_adopt(struct kvt_engine *e, uint32_t seq, uint32_t i, const struct kvt_fmt_blkref *r,
	      uint32_t *out)
{
	struct kvt_nvme_slotinfo si = { .tag = r->tag, .lenc = r->lenc };
	struct kvt_block *b;
	uint32_t id;
	int rc;

	if (kvt_test_adopt_fail && --kvt_test_adopt_fail == 0)
		return kvt_err(-ENOMEM, "block %u: adoption failed (test hook)", i);
	rc = kvt_nvme_slot_set(e->nvme, r->slot, &si);

	if (rc)
		return kvt_err(-ENOENT, "block %u: %s", i, kvt_last_error_message());
	rc = kvt_block_new(e, seq, i, &id);
	if (rc)
		return rc;
	b = kvt_blk(e, id);
	b->written = 1;
	b->slot[KVT_TIER_NVME] = r->slot;
	kvt_owner_set(e, KVT_TIER_NVME, r->slot, id);
	kvt_tenant_account(e, id, KVT_TIER_NVME, 1); /* as kvt_slot_alloc does */
	kvt_copy_set_present(e, id, KVT_TIER_NVME);
	*out = id;
	return 0;
}

/* Undo persist_adopt() of block @id (refs 1): it goes, its slot returns to KVT_SLOT_STORED. */
static void
persist_unadopt(struct kvt_engine *e, uint32_t id)
{
	struct kvt_block *b = kvt_blk(e, id);
	uint32_t sl = b->slot[KVT_TIER_NVME];

	e->evict[KVT_TIER_NVME].ops->remove(&e->evict[KVT_TIER_NVME], id);
	kvt_tenant_account(e, id, KVT_TIER_NVME, -1);
	kvt_owner_set(e, KVT_TIER_NVME, sl, KVT_SLOT_STORED);
	b->slot[KVT_TIER_NVME] = KVT_NIL;
	kvt_copy_state_set(b, KVT_TIER_NVME, KVT_COPY_ABSENT);
	kvt_block_kill(e, id);
}

/* Undo a half-built restore: blocks it made go (their slots return to KVT_SLOT_STORED), blocks
 * it shared lose its reference. */
static void
persist_unbuild(struct kvt_engine *e, struct kvt_seqrec *s)
{
	while (s->n_blocks) {
		uint32_t id = s->blocks[--s->n_blocks];
		struct kvt_block *b;

		if (id == KVT_NIL)
			continue; /* a hole */
		b = kvt_blk(e, id);
		if (b->refs > 1) {
			kvt_block_kill(e, id);
			continue;
		}
		persist_unadopt(e, id);
	}
}

/* Build the sequence @idx from @rec: blocks whose only copy is the stored NVMe slot, or the
 * blocks a prefix attach already made from it (shared). */
static int
persist_build(struct kvt_engine *e, uint32_t idx, struct kvt_store_sess *rec)
{
	static const uint8_t zero[16];
	struct kvt_seqrec *s = &e->seqs[idx];
	uint32_t tpb = e->layout.tokens_per_block, id, hole, hole_end;
	int rc;

	if (kvt_seq_reserve(s, rec->n_tokens, rec->n_blocks, 0))
		return kvt_err(-ENOMEM, "restoring a session of %llu tokens",
			       (unsigned long long)rec->n_tokens);
	/* a holder's tenant was checked by persist_check, under this same lock hold; holes
	 * (persist_check_holes: where this engine's window drops blocks) stay holes */
	persist_holes(rec, &hole, &hole_end);
	kvt_seq_set_first_live(e, s, hole_end);
	if (hole_end) {
		s->tail_hashed = !!memcmp(rec->blocks[hole_end - 1].hash, zero, sizeof zero);
		memcpy(kvt_win_tail(e, s), rec->blocks[hole_end - 1].hash, 16);
	}
	for (uint32_t i = 0; i < rec->n_blocks; i++) {
		if (rec->blocks[i].slot == KVT_FMT_HOLE) {
			s->blocks[s->n_blocks++] = KVT_NIL;
			continue;
		}
		id = persist_holder(e, &rec->blocks[i]);
		if (id != KVT_NIL) {
			kvt_block_ref(e, id);
		} else if ((rc = persist_adopt(e, idx, i, &rec->blocks[i], &id)) != 0) {
			persist_unbuild(e, s);
			return rc;
		}
		s->blocks[s->n_blocks++] = id;
	}
	if (rec->n_tokens)
		memcpy(s->tokens, rec->tokens, rec->n_tokens * sizeof *s->tokens);
	s->n_tokens = rec->n_tokens;
	/* blocks made here that carry a prefix key can be shared again (kvt_seq_attach_prefix):
	 * into the prefix index, tokens borrowed from s */
	for (uint32_t i = 0; i < rec->n_blocks; i++) {
		struct kvt_block *b;

		if (s->blocks[i] == KVT_NIL)
			continue; /* a hole */
		b = kvt_blk(e, s->blocks[i]);
		if (b->seq != idx || b->hashed || (uint64_t)(i + 1) * tpb > rec->n_tokens ||
		    !memcmp(rec->blocks[i].hash, zero, sizeof zero))
			continue;
		memcpy(b->hash, rec->blocks[i].hash, sizeof b->hash);
		b->hashed = 1;
		(void)kvt_prefix_insert(e, s->blocks[i]); /* -ENOMEM only costs sharing */
	}
	s->parked = 1;
	rec->open_seq = idx;
	return 0;
}

uint32_t
kvt_persist_prefix(struct kvt_engine *e, uint32_t tenant, const int32_t *tokens,
		   const uint64_t salt[2], uint32_t k, uint32_t max, uint32_t seq, uint32_t *ids)
{
	uint32_t tpb = e->layout.tokens_per_block, j, idx, found;
	uint64_t h[2] = { 0, 0 };
	struct kvt_store_sess *rec;

	if (!e->store || k >= max)
		return 0;
	for (j = 0; j <= k; j++)
		kvt_prefix_hash(h, tokens + (uint64_t)j * tpb, tpb, salt, h);
	/* another tenant's session is never used, whatever its keys (the tenant is in the key
	 * too, but keys written by older builds were not derived that way) */
	if (!kvt_store_find_hash(e->store, (const uint8_t *)h, &rec, &idx) || idx != k ||
	    rec->tenant != tenant || rec->open_seq != PERSIST_NO_SEQ || (uint64_t)k * tpb > rec->n_tokens ||
	    memcmp(rec->tokens, tokens, (size_t)k * tpb * sizeof *tokens) != 0)
		return 0;
	for (j = k; j < max && j < rec->n_blocks && (uint64_t)(j + 1) * tpb <= rec->n_tokens; j++) {
		uint32_t own;

		if (rec->blocks[j].slot == KVT_FMT_HOLE)
			break; /* dropped out of its window: the chain of data ends here */
		own = kvt_owner(e, KVT_TIER_NVME, rec->blocks[j].slot);

		if (j > k)
			kvt_prefix_hash(h, tokens + (uint64_t)j * tpb, tpb, salt, h);
		/* the key, then the tokens themselves: never by hash alone */
		if (memcmp(rec->blocks[j].hash, h, sizeof h) != 0 ||
		    memcmp(rec->tokens + (uint64_t)j * tpb, tokens + (uint64_t)j * tpb,
			   (size_t)tpb * sizeof *tokens) != 0 ||
		    (own != KVT_SLOT_STORED && own != KVT_SLOT_PENDING) ||
		    persist_check_one(e, rec, j) != 0)
			break;
	}
	found = j - k;
	for (j = k; seq != PERSIST_NO_SEQ && j < k + found; j++) {
		struct kvt_block *b;

		if (persist_adopt(e, seq, j, &rec->blocks[j], &ids[j]) != 0)
			return j - k;
		b = kvt_blk(e, ids[j]);
		memcpy(b->hash, rec->blocks[j].hash, sizeof b->hash);
		b->hashed = 1;
		/* -ENOMEM only costs sharing with later sequences */
		(void)kvt_prefix_insert(e, ids[j]); /* tokens borrowed from seq */
	}
	return found;
}

/* Block @j of @rec can serve a windowed hit: stored (not a hole), keyed @key, its NVMe slot
 * still the store's (its header is checked apart, persist_window_ok). */
static bool
persist_blk_stored(struct kvt_engine *e, const struct kvt_store_sess *rec, uint32_t j,
		   const uint64_t *key)
{
	const struct kvt_fmt_blkref *r = &rec->blocks[j];
	uint32_t own;

	if (r->slot == KVT_FMT_HOLE || memcmp(r->hash, key, 16) != 0)
		return false;
	own = kvt_owner(e, KVT_TIER_NVME, r->slot);
	return own == KVT_SLOT_STORED || own == KVT_SLOT_PENDING;
}

/*
 * Whether stored session @rec holds, as stored blocks keyed @keys[j] whose headers check, what a
 * windowed hit of @K blocks reads: the sinks below the window, [0, nsink), and [first, K). The
 * cheap tests come first for every block read, then the header reads; @hdr caches each block's
 * header check for the whole search (0 unknown, 1 good, 2 bad), so a block's header is read at
 * most once per call.
 */
static bool
persist_window_ok(struct kvt_engine *e, const struct kvt_store_sess *rec, const uint64_t *keys,
		  uint32_t K, uint8_t *hdr)
{
	uint32_t lo = kvt_win_first_block(e, (uint64_t)K * e->layout.tokens_per_block);
	uint32_t nsink = kvt_win_sink_blocks(e), run[2][2], r, j;

	run[0][0] = 0;
	run[0][1] = nsink < lo ? nsink : lo;
	run[1][0] = lo;
	run[1][1] = K;
	for (r = 0; r < 2; r++)
		for (j = run[r][0]; j < run[r][1]; j++)
			if (!persist_blk_stored(e, rec, j, keys + 2 * (size_t)j))
				return false;
	for (r = 0; r < 2; r++)
		for (j = run[r][0]; j < run[r][1]; j++) {
			if (!hdr[j])
				hdr[j] = persist_check_one(e, rec, j) == 0 ? 1 : 2;
			if (hdr[j] != 1)
				return false;
		}
	return true;
}

uint32_t
kvt_persist_prefix_window(struct kvt_engine *e, uint32_t tenant, const int32_t *tokens,
			  uint64_t n, const uint64_t salt[2], uint32_t k, uint32_t max,
			  uint32_t seq, uint32_t *ids, uint64_t tail[2])
{
	uint32_t tpb = e->layout.tokens_per_block, nsink = kvt_win_sink_blocks(e);
	uint32_t best = 0, i, j, K, lim, lo, nkeys = 0, *made = NULL;
	struct kvt_store_sess *rec, *from = NULL;
	uint64_t h[2] = { 0, 0 }, *keys = NULL;
	uint8_t *hdr = NULL;

	if (!e->store || !e->win_tokens)
		return 0;
	if ((uint64_t)max * tpb > n)
		max = (uint32_t)(n / tpb);
	if (k >= max)
		return 0;
	for (i = 0; i < kvt_store_count(e->store); i++) {
		rec = kvt_store_at(e->store, i);
		/* another tenant's session is never used, whatever its keys (as above) */
		if (!rec || rec->tenant != tenant || rec->open_seq != PERSIST_NO_SEQ)
			continue;
		lim = max < rec->n_blocks ? max : rec->n_blocks;
		if ((uint64_t)lim * tpb > rec->n_tokens)
			lim = (uint32_t)(rec->n_tokens / tpb);
		for (K = 0; K < lim && memcmp(rec->tokens + (uint64_t)K * tpb,
					      tokens + (uint64_t)K * tpb,
					      (size_t)tpb * sizeof *tokens) == 0; K++)
			;
		if (K <= k || K <= best)
			continue;
		/* the tokens, then the keys: never by hash alone. The prompt's keys are made
		 * once a session shares more than the hit to beat, up to what it shares */
		if (!keys) {
			keys = kvt_malloc((size_t)max * sizeof h);
			hdr = kvt_malloc(max);
			if (!keys || !hdr)
				goto out; /* no memory: no hit, which is always correct */
		}
		for (; nkeys < K; nkeys++) {
			kvt_prefix_hash(h, tokens + (uint64_t)nkeys * tpb, tpb, salt, h);
			memcpy(keys + 2 * (size_t)nkeys, h, sizeof h);
		}
		memset(hdr, 0, K);
		for (; K > k && K > best; K--)
			if (persist_window_ok(e, rec, keys, K, hdr)) {
				best = K;
				from = rec;
				break;
			}
	}
	if (!best || seq == PERSIST_NO_SEQ)
		goto out;
	/* made in a scratch array: on a failure @ids (the prefix index's hit) stays as it was */
	made = kvt_malloc((size_t)best * sizeof *made);
	if (!made) {
		best = 0;
		goto out;
	}
	lo = kvt_win_first_block(e, (uint64_t)best * tpb);
	for (j = 0; j < best; j++) {
		if (j >= nsink && j < lo) {
			made[j] = KVT_NIL; /* out of the window: a hole */
			continue;
		}
		if (persist_adopt(e, seq, j, &from->blocks[j], &made[j]) != 0)
			break;
	}
	if (j < best) { /* all or nothing: a windowed hit needs every block it reads */
		for (i = 0; i < j; i++)
			if (made[i] != KVT_NIL)
				persist_unadopt(e, made[i]);
		best = 0;
		goto out;
	}
	for (j = 0; j < best; j++) {
		struct kvt_block *b;

		ids[j] = made[j];
		if (made[j] == KVT_NIL)
			continue;
		b = kvt_blk(e, made[j]);
		memcpy(b->hash, from->blocks[j].hash, sizeof b->hash);
		b->hashed = 1;
		/* -ENOMEM only costs sharing with later sequences */
		(void)kvt_prefix_insert(e, made[j]); /* tokens borrowed from seq */
	}
	if (lo)
		memcpy(tail, keys + 2 * (size_t)(lo - 1), 2 * sizeof *tail);
out:
	kvt_free(made);
	kvt_free(hdr);
	kvt_free(keys);
	return best;
}

/* Close the empty sequence @idx that a failed restore opened. */
static void
persist_unopen(struct kvt_engine *e, uint32_t idx)
{
	struct kvt_seqrec *s = &e->seqs[idx];

	s->open = 0;
	s->n_tokens = 0;
	if (++s->gen == 0)
		s->gen = 1;
	s->next_free = e->seq_free;
	e->seq_free = idx;
	e->n_open_seqs--;
}

int
kvt_seq_restore(struct kvt_engine *e, uint64_t key, const struct kvt_seq_opts *o,
		kvt_seq_id *out)
{
	struct kvt_seq_opts opts;
	struct kvt_store_sess *rec;
	uint32_t idx;
	int rc;

	if (!e || !out)
		return kvt_err(-EINVAL, "kvt_seq_restore: engine and out must not be NULL");
	if (e->grp)
		return kvt_grp_seq_restore(e, key, o, out);
	*out = 0;
	rc = kvt_seq_opts_copy(&opts, o);
	if (rc)
		return rc;
	opts.session_key = key;
	kvt_lock(e);
	rec = e->store ? kvt_store_find(e->store, key) : NULL;
	if (!rec) {
		rc = kvt_err(-ENOENT, "session %#llx is not in the store%s",
			     (unsigned long long)key,
			     e->store ? "" : " (the engine has no persistent store)");
		goto out;
	}
	if (rec->tenant != opts.tenant) {
		rc = kvt_err(-EPERM, "session %#llx was stored for another tenant than %u (the "
			     "caller's kvt_seq_opts.tenant)", (unsigned long long)key, opts.tenant);
		goto out;
	}
	if (rec->open_seq != PERSIST_NO_SEQ) {
		rc = kvt_err(KVT_EBUSY, "session %#llx is open in this engine",
			     (unsigned long long)key);
		goto out;
	}
	if (rec->n_blocks > kvt_seq_max_blocks(e)) {
		/* a stored session fits NVMe, so this is only reached once slots were quarantined
		 * for good (IO errors) since it was stored: it could never be read back here */
		rc = kvt_err(KVT_ETOOBIG, "session %#llx has %u blocks, more than one sequence may "
			     "hold in this engine's tiers (%u: see kvt_seq_append); it stays in the "
			     "store", (unsigned long long)key, rec->n_blocks, kvt_seq_max_blocks(e));
		goto out;
	}
	rc = persist_check(e, rec);
	if (rc == -ENOENT) {
		char why[256];

		snprintf(why, sizeof why, "%s", kvt_last_error_message());
		if (persist_drop(e, rec) == 0)
			(void)persist_commit(e);
		rc = kvt_err(-ENOENT, "session %#llx did not survive (dropped): %s",
			     (unsigned long long)key, why);
		goto out;
	}
	if (rc == -EPERM) {
		char why[256];

		snprintf(why, sizeof why, "%s", kvt_last_error_message());
		rc = kvt_err(-EPERM, "session %#llx not restored (it stays in the store): %s",
			     (unsigned long long)key, why);
		goto out;
	}
	if (rc == 0)
		rc = kvt_seq_open_locked(e, &opts, &idx);
	if (rc == 0) {
		rc = persist_build(e, idx, rec);
		if (rc == 0)
			*out = ((uint64_t)e->seqs[idx].gen << 32) | idx;
		else
			persist_unopen(e, idx);
	}
out:
	kvt_unlock(e);
	return rc;
}

/* Drop the stored session @key of @tenant (PERSIST_ANY_TENANT: of any tenant). */
static int
persist_drop_key(struct kvt_engine *e, uint64_t tenant, uint64_t key)
{
	struct kvt_store_sess *rec;
	int rc;

	kvt_lock(e);
	rec = e->store ? kvt_store_find(e->store, key) : NULL;
	if (!rec)
		rc = kvt_err(-ENOENT, "session %#llx is not in the store", (unsigned long long)key);
	else if (tenant != PERSIST_ANY_TENANT && rec->tenant != tenant)
		rc = kvt_err(-EPERM, "session %#llx was stored for another tenant than %u",
			     (unsigned long long)key, (uint32_t)tenant);
	else if (rec->open_seq != PERSIST_NO_SEQ)
		rc = kvt_err(KVT_EBUSY, "session %#llx is open in this engine: close it",
			     (unsigned long long)key);
	else
		rc = persist_drop(e, rec);
	if (rc == 0) {
		rc = persist_commit(e);
		rc = rc < 0 ? rc : 0;
	}
	kvt_unlock(e);
	return rc;
}

int
kvt_session_drop(struct kvt_engine *e, uint64_t key)
{
	if (!e)
		return kvt_err(-EINVAL, "kvt_session_drop: engine is NULL");
	if (e->grp)
		return kvt_grp_session_drop(e, true, 0, key);
	return persist_drop_key(e, PERSIST_ANY_TENANT, key);
}

int
kvt_session_drop_tenant(struct kvt_engine *e, uint32_t tenant, uint64_t key)
{
	if (!e)
		return kvt_err(-EINVAL, "kvt_session_drop_tenant: engine is NULL");
	if (e->grp)
		return kvt_grp_session_drop(e, false, tenant, key);
	return persist_drop_key(e, tenant, key);
}

/* ---- the external pool's blocks (engine/ext.c, issue 19): one record per stored block, of
 * one block and tokens_per_block tokens KVT_EXT_TOKEN, under a key ext.c derives from the
 * caller's hash and the tenant; open_seq PERSIST_EXT while a pool holds it (never restorable,
 * listed or given up by kvt_persist_reclaim then; after a restart, until a pool adopts it, it is
 * an ordinary restorable record) */
#define PERSIST_EXT (UINT32_MAX - 1)

bool
kvt_persist_ext_rec(const struct kvt_engine *e, const struct kvt_store_sess *rec)
{
	if (rec->n_blocks != 1 || rec->n_tokens != e->layout.tokens_per_block ||
	    rec->open_seq != PERSIST_NO_SEQ)
		return false;
	for (uint64_t i = 0; i < rec->n_tokens; i++)
		if (rec->tokens[i] != KVT_EXT_TOKEN)
			return false;
	return true;
}

int
kvt_persist_ext_put(struct kvt_engine *e, uint64_t key, uint32_t tenant, uint32_t id)
{
	const struct kvt_block *b = kvt_blk(e, id);
	struct kvt_store_sess *old = kvt_store_find(e->store, key);
	struct kvt_nvme_slotinfo si = { 0 };
	struct kvt_fmt_blkref ref = { 0 };
	uint32_t from = e->n_pend, tpb = e->layout.tokens_per_block;
	int32_t *tok;
	int rc;

	if (!kvt_copy_valid(b, KVT_TIER_NVME) ||
	    !kvt_nvme_slot_info(e->nvme, b->slot[KVT_TIER_NVME], &si))
		return kvt_err(-ENOENT, "store: external block %u has no completed NVMe write", id);
	if (old && old->open_seq != PERSIST_EXT)
		return kvt_err(-EEXIST, "store: key %#llx of an external block is a session's",
			       (unsigned long long)key);
	if (old && (rc = persist_queue(e, old)) != 0)
		return rc;
	tok = kvt_malloc((size_t)tpb * sizeof *tok);
	if (!tok) {
		e->n_pend = from;
		return kvt_err(-ENOMEM, "store: external block record");
	}
	for (uint32_t i = 0; i < tpb; i++)
		tok[i] = KVT_EXT_TOKEN;
	ref.slot = b->slot[KVT_TIER_NVME];
	ref.tag = si.tag;
	ref.lenc = si.lenc;
	rc = kvt_store_put(e->store, key, tenant, KVT_EVICT_PRIO_DEFAULT, tok, tpb, &ref, 1,
			   PERSIST_EXT);
	kvt_free(tok);
	if (rc) {
		e->n_pend = from;
		return rc;
	}
	persist_unstore(e, from);
	persist_name(e, kvt_store_find(e->store, key));
	return 0;
}

int
kvt_persist_ext_del(struct kvt_engine *e, uint64_t key)
{
	struct kvt_store_sess *rec = kvt_store_find(e->store, key);

	if (!rec || rec->open_seq != PERSIST_EXT)
		return 0;
	return persist_drop(e, rec);
}

int
kvt_persist_ext_commit(struct kvt_engine *e)
{
	int rc = persist_commit(e);

	return rc < 0 ? rc : 0;
}

int
kvt_persist_ext_adopt(struct kvt_engine *e, struct kvt_store_sess *rec, uint32_t *id)
{
	int rc = persist_check(e, rec);

	if (rc == 0)
		rc = persist_adopt(e, KVT_EXT_SEQ, 0, &rec->blocks[0], id);
	if (rc == 0)
		rec->open_seq = PERSIST_EXT;
	return rc;
}
