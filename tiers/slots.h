/* SPDX-License-Identifier: MIT */
/*
 * tiers/slots.h - the generic slot allocator every tier uses (internal).
 *
 * A tier has n_slots fixed-size places numbered 0..n_slots-1. The allocator keeps one 32-bit
 * entry per slot: for an allocated slot, the owner value its user stores there (the engine: the
 * block id, or a KVT_SLOT_* marker); for a free slot, the link to the next free slot. The free
 * slots form a LIFO list threaded through those entries (the most recently freed slot is reused
 * first, which keeps the working set of HBM/HOST slots warm in caches and TLBs), and one bit
 * per slot says which slots are allocated, so that a double free or an out-of-range id is
 * refused instead of corrupting the list and a free slot's owner reads as KVT_SLOTS_FREE.
 * Every operation is O(1) except kvt_slots_take and an alloc that gives up a shadow, which scans
 * the shadow table on from where the last one gave up (at most KVT_SLOTS_SHADOWS entries; one
 * sweep of the table gives up every shadow it passes). Memory is 4 bytes and 1 bit per slot,
 * plus 6 KiB for shadows where enabled (below).
 *
 * Threading: not thread-safe; the engine calls it under its mutex.
 */
#ifndef KVT_TIERS_SLOTS_H
#define KVT_TIERS_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#define KVT_SLOTS_FREE UINT32_MAX /* owner value of a free slot (== KVT_NIL) */

/* A free slot that still holds a block's older bytes (kvt_slots_free_shadow). */
struct kvt_slot_shadow {
	uint32_t slot;   /* KVT_SLOTS_FREE: entry unused */
	uint32_t owner;  /* whose bytes (the engine: the block id) */
	uint32_t valid;  /* what of them is still good (the engine: leading tokens) */
};

#define KVT_SLOTS_SHADOWS 512u /* shadow entries (direct-mapped by owner), 12 bytes each */

struct kvt_slots {
	uint32_t n_slots; /* slots managed, ids 0..n_slots-1 */
	uint32_t n_free;  /* free slots: the free list's and the shadows */
	uint32_t head;    /* free slot handed out next, KVT_SLOTS_FREE when none */
	uint32_t *ent;    /* [n_slots] owner value (allocated) or next free slot (free) */
	uint64_t *used;   /* [ceil(n_slots / 64)] bit set while a slot is allocated */
	struct kvt_slot_shadow *sh; /* [KVT_SLOTS_SHADOWS] or NULL: shadows off */
	uint32_t n_shadow;  /* entries in use: free slots not on the free list */
	uint32_t sh_cursor; /* where alloc looks for a shadow to give up next */
};

/**
 * kvt_slots_init() - set up @s for @n slots, all free. Slot 0 is handed out first, then 1, ...
 * @s: caller-allocated; fully overwritten. @n: 0 is allowed (every alloc fails).
 * Returns 0 or -ENOMEM (then @s needs no kvt_slots_fini, though calling it is harmless).
 */
int kvt_slots_init(struct kvt_slots *s, uint32_t n);

/** kvt_slots_fini() - free @s's arrays and zero it. NULL and a zeroed @s are accepted. */
void kvt_slots_fini(struct kvt_slots *s);

/**
 * kvt_slots_alloc() - take a free slot; its owner value starts as KVT_SLOTS_FREE.
 * @out: receives the slot id.
 * Returns 0, or -ENOSPC when every slot is in use (*out untouched).
 */
int kvt_slots_alloc(struct kvt_slots *s, uint32_t *out);

/**
 * kvt_slots_free() - give @slot back (its owner value is forgotten).
 * Returns 0, or -EINVAL when @slot is out of range or not allocated (double free); @s is left
 * unchanged in that case.
 */
int kvt_slots_free(struct kvt_slots *s, uint32_t slot);

/**
 * kvt_slots_take() - mark the @n given slots allocated (used at start-up, to keep the slots of a
 * persistent store's sessions), their owner values KVT_SLOTS_FREE; every shadow is dropped
 * (its slot joins the free list). O(n_slots). Returns 0, or -EINVAL (a slot out of range,
 * taken, or given twice) with nothing changed.
 */
int kvt_slots_take(struct kvt_slots *s, const uint32_t *slots, uint32_t n);

/*
 * Shadows: a slot freed with kvt_slots_free_shadow() counts as free (n_free, every room
 * computation) but is handed out only when the free list is empty, so the bytes it holds
 * stay until the slot is needed: the engine keeps there the HOST copy an append made old, and
 * a later demotion of the block copies only what changed into it (kvt_slots_claim_shadow).
 * One entry per owner, at most KVT_SLOTS_SHADOWS, direct-mapped by owner: a second shadow
 * of an owner, or one of another owner on the same entry, puts the older one on the free
 * list. A shadow slot reads as free (kvt_slots_is_used false, owner KVT_SLOTS_FREE).
 */

/** kvt_slots_shadow_enable() - allow shadows on @s. Returns 0 or -ENOMEM (@s unchanged). */
int kvt_slots_shadow_enable(struct kvt_slots *s);

/**
 * kvt_slots_free_shadow() - free allocated @slot as @owner's shadow, @valid (> 0) saying what
 * of its bytes stays good. Without shadows enabled (or @valid 0) a plain kvt_slots_free().
 * Returns 0, or -EINVAL as kvt_slots_free (then nothing changed).
 */
int kvt_slots_free_shadow(struct kvt_slots *s, uint32_t slot, uint32_t owner, uint32_t valid);

/**
 * kvt_slots_claim_shadow() - take @owner's shadow back, allocated (owner value KVT_SLOTS_FREE,
 * as alloc gives): *slot and *valid receive it. Returns 0, or -ENOENT when @owner has none
 * (nothing changed).
 */
int kvt_slots_claim_shadow(struct kvt_slots *s, uint32_t owner, uint32_t *slot,
			   uint32_t *valid);

/** kvt_slots_shadow_clamp() - @owner's shadow, if any, keeps at most @valid (0: it goes on the
 * free list). */
void kvt_slots_shadow_clamp(struct kvt_slots *s, uint32_t owner, uint32_t valid);

/** kvt_slots_used() - number of slots allocated now. */
uint32_t kvt_slots_used(const struct kvt_slots *s);

/** kvt_slots_is_used() - whether @slot is allocated (false when out of range). */
static inline bool
kvt_slots_is_used(const struct kvt_slots *s, uint32_t slot)
{
	return slot < s->n_slots && (s->used[slot / 64] >> (slot % 64) & 1);
}

/** kvt_slots_owner() - the owner value stored for allocated @slot; KVT_SLOTS_FREE when @slot
 * is free or out of range. */
static inline uint32_t
kvt_slots_owner(const struct kvt_slots *s, uint32_t slot)
{
	return kvt_slots_is_used(s, slot) ? s->ent[slot] : KVT_SLOTS_FREE;
}

/** kvt_slots_set_owner() - store @owner for allocated @slot (ignored for a free one). */
static inline void
kvt_slots_set_owner(struct kvt_slots *s, uint32_t slot, uint32_t owner)
{
	if (kvt_slots_is_used(s, slot))
		s->ent[slot] = owner;
}

/** kvt_slots_meta_bytes() - host bytes @s holds (entries and bitmap). */
static inline uint64_t
kvt_slots_meta_bytes(const struct kvt_slots *s)
{
	return (uint64_t)s->n_slots * sizeof *s->ent + ((uint64_t)s->n_slots + 63) / 64 * 8 +
	       (s->sh ? KVT_SLOTS_SHADOWS * sizeof *s->sh : 0);
}

#endif /* KVT_TIERS_SLOTS_H */
