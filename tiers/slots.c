/* SPDX-License-Identifier: MIT */
/* tiers/slots.c - LIFO slot allocator, free list threaded through the owner entries, with
 * double-free detection (see slots.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/base/error.h"
#include "tiers/slots.h"

int
kvt_slots_init(struct kvt_slots *s, uint32_t n)
{
	uint32_t i;

	memset(s, 0, sizeof *s);
	s->head = KVT_SLOTS_FREE;
	if (n == 0)
		return 0;
	s->ent = malloc((size_t)n * sizeof *s->ent);
	s->used = calloc(((size_t)n + 63) / 64, sizeof *s->used);
	if (!s->ent || !s->used) {
		kvt_slots_fini(s);
		return kvt_err(-ENOMEM, "slot allocator for %u slots", n);
	}
	/* slot 0 first, then 1, ...: the order a stack pushed in reverse would give */
	for (i = 0; i < n; i++)
		s->ent[i] = i + 1 < n ? i + 1 : KVT_SLOTS_FREE;
	s->head = 0;
	s->n_slots = n;
	s->n_free = n;
	return 0;
}

void
kvt_slots_fini(struct kvt_slots *s)
{
	if (!s)
		return;
	free(s->ent);
	free(s->used);
	free(s->sh);
	memset(s, 0, sizeof *s);
	s->head = KVT_SLOTS_FREE;
}

/* Put @sh's slot on the free list (its shadow forgotten; n_free unchanged). */
static void
shadow_drop(struct kvt_slots *s, struct kvt_slot_shadow *sh)
{
	s->ent[sh->slot] = s->head;
	s->head = sh->slot;
	sh->slot = KVT_SLOTS_FREE;
	s->n_shadow--;
}

int
kvt_slots_alloc(struct kvt_slots *s, uint32_t *out)
{
	uint32_t slot;

	if (s->n_free == 0)
		return kvt_err(-ENOSPC, "all %u slots in use", s->n_slots);
	if (s->head == KVT_SLOTS_FREE) { /* only shadows are left: give the next one up */
		while (s->sh[s->sh_cursor].slot == KVT_SLOTS_FREE)
			s->sh_cursor = (s->sh_cursor + 1) % KVT_SLOTS_SHADOWS;
		shadow_drop(s, &s->sh[s->sh_cursor]);
		s->sh_cursor = (s->sh_cursor + 1) % KVT_SLOTS_SHADOWS; /* the next scan goes on */
	}
	slot = s->head;
	s->head = s->ent[slot];
	s->n_free--;
	s->used[slot / 64] |= 1ull << (slot % 64);
	s->ent[slot] = KVT_SLOTS_FREE;
	*out = slot;
	return 0;
}

int
kvt_slots_free(struct kvt_slots *s, uint32_t slot)
{
	if (slot >= s->n_slots)
		return kvt_err(-EINVAL, "free of slot %u out of range (%u slots)", slot, s->n_slots);
	if (!kvt_slots_is_used(s, slot))
		return kvt_err(-EINVAL, "double free of slot %u", slot);
	s->used[slot / 64] &= ~(1ull << (slot % 64));
	s->ent[slot] = s->head;
	s->head = slot;
	s->n_free++;
	return 0;
}

int
kvt_slots_shadow_enable(struct kvt_slots *s)
{
	uint32_t i;

	if (s->sh)
		return 0;
	s->sh = malloc(KVT_SLOTS_SHADOWS * sizeof *s->sh);
	if (!s->sh)
		return kvt_err(-ENOMEM, "slot shadows");
	for (i = 0; i < KVT_SLOTS_SHADOWS; i++)
		s->sh[i].slot = KVT_SLOTS_FREE;
	return 0;
}

int
kvt_slots_free_shadow(struct kvt_slots *s, uint32_t slot, uint32_t owner, uint32_t valid)
{
	struct kvt_slot_shadow *sh;
	int rc = kvt_slots_free(s, slot);

	if (rc || !s->sh || valid == 0)
		return rc;
	/* off the free list again (it is its head now), onto the owner's entry */
	s->head = s->ent[slot];
	sh = &s->sh[owner % KVT_SLOTS_SHADOWS];
	if (sh->slot != KVT_SLOTS_FREE)
		shadow_drop(s, sh);
	sh->slot = slot;
	sh->owner = owner;
	sh->valid = valid;
	s->n_shadow++;
	return 0;
}

int
kvt_slots_claim_shadow(struct kvt_slots *s, uint32_t owner, uint32_t *slot, uint32_t *valid)
{
	struct kvt_slot_shadow *sh = s->sh ? &s->sh[owner % KVT_SLOTS_SHADOWS] : NULL;

	if (!sh || sh->slot == KVT_SLOTS_FREE || sh->owner != owner)
		return -ENOENT;
	*slot = sh->slot;
	*valid = sh->valid;
	sh->slot = KVT_SLOTS_FREE;
	s->n_shadow--;
	s->n_free--;
	s->used[*slot / 64] |= 1ull << (*slot % 64);
	s->ent[*slot] = KVT_SLOTS_FREE;
	return 0;
}

void
kvt_slots_shadow_clamp(struct kvt_slots *s, uint32_t owner, uint32_t valid)
{
	struct kvt_slot_shadow *sh = s->sh ? &s->sh[owner % KVT_SLOTS_SHADOWS] : NULL;

	if (!sh || sh->slot == KVT_SLOTS_FREE || sh->owner != owner)
		return;
	if (valid == 0)
		shadow_drop(s, sh);
	else if (valid < sh->valid)
		sh->valid = valid;
}

uint32_t
kvt_slots_used(const struct kvt_slots *s)
{
	return s->n_slots - s->n_free;
}

int
kvt_slots_take(struct kvt_slots *s, const uint32_t *slots, uint32_t n)
{
	uint32_t i, next = KVT_SLOTS_FREE, top = 0;

	for (i = 0; i < n; i++) {
		if (slots[i] >= s->n_slots || kvt_slots_is_used(s, slots[i])) {
			uint32_t bad = slots[i];

			while (i-- > 0) /* undo this call's marks */
				s->used[slots[i] / 64] &= ~(1ull << (slots[i] % 64));
			return kvt_err(-EINVAL, "slot %u out of range, taken or given twice", bad);
		}
		s->used[slots[i] / 64] |= 1ull << (slots[i] % 64);
	}
	for (i = 0; i < n; i++)
		s->ent[slots[i]] = KVT_SLOTS_FREE;
	for (i = 0; s->sh && i < KVT_SLOTS_SHADOWS; i++) /* they join the free list below */
		s->sh[i].slot = KVT_SLOTS_FREE;
	s->n_shadow = 0;
	/* rebuild the free list, lowest slot first as at init */
	for (i = s->n_slots; i-- > 0;)
		if (!kvt_slots_is_used(s, i)) {
			s->ent[i] = next;
			next = i;
			top++;
		}
	s->head = next;
	s->n_free = top;
	return 0;
}
