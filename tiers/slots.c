/* SPDX-License-Identifier: MIT */
/* tiers/slots.c - LIFO free-stack slot allocator with double-free detection (see slots.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "tiers/slots.h"

int
kvt_slots_init(struct kvt_slots *s, uint32_t n)
{
	uint32_t i;

	memset(s, 0, sizeof *s);
	if (n == 0)
		return 0;
	s->stack = malloc((size_t)n * sizeof *s->stack);
	s->used = calloc(n, sizeof *s->used);
	if (!s->stack || !s->used) {
		kvt_slots_fini(s);
		return kvt_err(-ENOMEM, "slot allocator for %u slots", n);
	}
	/* Pushed in reverse so that slot 0 is on top and handed out first. */
	for (i = 0; i < n; i++)
		s->stack[i] = n - 1 - i;
	s->n_slots = n;
	s->n_free = n;
	return 0;
}

void
kvt_slots_fini(struct kvt_slots *s)
{
	if (!s)
		return;
	free(s->stack);
	free(s->used);
	memset(s, 0, sizeof *s);
}

int
kvt_slots_alloc(struct kvt_slots *s, uint32_t *out)
{
	uint32_t slot;

	if (s->n_free == 0)
		return kvt_err(-ENOSPC, "all %u slots in use", s->n_slots);
	slot = s->stack[--s->n_free];
	s->used[slot] = 1;
	*out = slot;
	return 0;
}

int
kvt_slots_free(struct kvt_slots *s, uint32_t slot)
{
	if (slot >= s->n_slots)
		return kvt_err(-EINVAL, "free of slot %u out of range (%u slots)", slot, s->n_slots);
	if (!s->used[slot])
		return kvt_err(-EINVAL, "double free of slot %u", slot);
	s->used[slot] = 0;
	s->stack[s->n_free++] = slot;
	return 0;
}

uint32_t
kvt_slots_used(const struct kvt_slots *s)
{
	return s->n_slots - s->n_free;
}

bool
kvt_slots_is_used(const struct kvt_slots *s, uint32_t slot)
{
	return slot < s->n_slots && s->used[slot];
}

int
kvt_slots_take(struct kvt_slots *s, const uint32_t *slots, uint32_t n)
{
	uint32_t i, top = 0;

	for (i = 0; i < n; i++)
		if (slots[i] >= s->n_slots || s->used[slots[i]])
			return kvt_err(-EINVAL, "slot %u out of range or taken", slots[i]);
	for (i = 0; i < n; i++)
		s->used[slots[i]] = 1;
	/* rebuild the free stack, lowest slot on top as at init */
	for (i = s->n_slots; i-- > 0;)
		if (!s->used[i])
			s->stack[top++] = i;
	s->n_free = top;
	return 0;
}
