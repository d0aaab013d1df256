/* SPDX-License-Identifier: MIT */
/*
 * tiers/slots.h - the generic slot allocator every tier uses (internal).
 *
 * A tier has n_slots fixed-size places numbered 0..n_slots-1. The allocator hands them out from
 * a LIFO stack of free slot ids (the most recently freed slot is reused first, which keeps the
 * working set of HBM/HOST slots warm in caches and TLBs) and keeps one "used" byte per slot so
 * that a double free or an out-of-range id is refused instead of corrupting the stack.
 * Every operation is O(1); memory is 5 bytes per slot.
 *
 * Threading: not thread-safe; the engine calls it under its mutex.
 */
#ifndef KVT_TIERS_SLOTS_H
#define KVT_TIERS_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

struct kvt_slots {
	uint32_t n_slots; /* slots managed, ids 0..n_slots-1 */
	uint32_t n_free;  /* entries of stack in use: free slots */
	uint32_t *stack;  /* [n_slots] free slot ids; stack[n_free - 1] is handed out next */
	uint8_t *used;    /* [n_slots] 1 while a slot is allocated, 0 while free */
};

/**
 * kvt_slots_init() - set up @s for @n slots, all free. Slot 0 is handed out first.
 * @s: caller-allocated; fully overwritten. @n: 0 is allowed (every alloc fails).
 * Returns 0 or -ENOMEM (then @s needs no kvt_slots_fini, though calling it is harmless).
 */
int kvt_slots_init(struct kvt_slots *s, uint32_t n);

/** kvt_slots_fini() - free @s's arrays and zero it. NULL and a zeroed @s are accepted. */
void kvt_slots_fini(struct kvt_slots *s);

/**
 * kvt_slots_alloc() - take a free slot.
 * @out: receives the slot id.
 * Returns 0, or -ENOSPC when every slot is in use (*out untouched).
 */
int kvt_slots_alloc(struct kvt_slots *s, uint32_t *out);

/**
 * kvt_slots_free() - give @slot back.
 * Returns 0, or -EINVAL when @slot is out of range or not allocated (double free); @s is left
 * unchanged in that case.
 */
int kvt_slots_free(struct kvt_slots *s, uint32_t slot);

/**
 * kvt_slots_take() - mark the @n given slots allocated (used at start-up, to keep the slots of a
 * persistent store's sessions). O(n_slots). Returns 0, or -EINVAL (a slot out of range, taken
 * or given twice) with nothing changed... except slots before the bad one when given twice.
 */
int kvt_slots_take(struct kvt_slots *s, const uint32_t *slots, uint32_t n);

/** kvt_slots_used() - number of slots allocated now. */
uint32_t kvt_slots_used(const struct kvt_slots *s);

/** kvt_slots_is_used() - whether @slot is allocated (false when out of range). */
bool kvt_slots_is_used(const struct kvt_slots *s, uint32_t slot);

#endif /* KVT_TIERS_SLOTS_H */
