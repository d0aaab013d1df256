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
	memset(s, 0, sizeof *s);
	s->head = KVT_SLOTS_FREE;
}

int
kvt_slots_alloc(struct kvt_slots *s, uint32_t *out)
{
	uint32_t slot;

	if (s->n_free == 0)
		return kvt_err(-ENOSPC, "all %u slots in use", s->n_slots);
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

uint32_t
kvt_slots_used(const struct kvt_slots *s)
{
	return s->n_slots - s->n_free;
}

int
kvt_slots_take(struct kvt_slots *s, const uint32_t *slots, uint32_t n)
{
	uint32_t i, next = KVT_SLOTS_FREE, top = 0;

	for (i = 0; i < n; i++)
		if (slots[i] >= s->n_slots || kvt_slots_is_used(s, slots[i]))
			return kvt_err(-EINVAL, "slot %u out of range or taken", slots[i]);
	for (i = 0; i < n; i++) {
		s->used[slots[i] / 64] |= 1ull << (slots[i] % 64);
		s->ent[slots[i]] = KVT_SLOTS_FREE;
	}
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
