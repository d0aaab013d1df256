/* SPDX-License-Identifier: MIT */
/* tests/test_slots.c - the generic slot allocator (tiers/slots.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "engine/kvtier.h"
#include "tiers/slots.h"

#define N 37u

static void
test_alloc_all_then_enospc(void **state)
{
	struct kvt_slots s;
	uint8_t seen[N] = { 0 };
	uint32_t slot = 12345;

	(void)state;
	assert_int_equal(kvt_slots_init(&s, N), 0);
	assert_int_equal(kvt_slots_used(&s), 0);
	for (uint32_t i = 0; i < N; i++) {
		assert_int_equal(kvt_slots_alloc(&s, &slot), 0);
		assert_true(slot < N);
		assert_int_equal(seen[slot], 0); /* never handed out twice */
		seen[slot] = 1;
		assert_true(kvt_slots_is_used(&s, slot));
		assert_int_equal(kvt_slots_used(&s), i + 1);
	}
	slot = 999;
	assert_int_equal(kvt_slots_alloc(&s, &slot), -ENOSPC);
	assert_int_equal(slot, 999); /* untouched on failure */
	assert_true(strstr(kvt_last_error_message(), "37") != NULL);
	kvt_slots_fini(&s);
}

static void
test_first_is_zero_and_lifo_reuse(void **state)
{
	struct kvt_slots s;
	uint32_t a, b, c, x;

	(void)state;
	assert_int_equal(kvt_slots_init(&s, N), 0);
	assert_int_equal(kvt_slots_alloc(&s, &a), 0);
	assert_int_equal(a, 0);
	assert_int_equal(kvt_slots_alloc(&s, &b), 0);
	assert_int_equal(kvt_slots_alloc(&s, &c), 0);
	assert_int_equal(kvt_slots_free(&s, a), 0);
	assert_int_equal(kvt_slots_free(&s, c), 0);
	assert_false(kvt_slots_is_used(&s, c));
	assert_int_equal(kvt_slots_used(&s), 1);
	/* LIFO: the last freed comes back first */
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, c);
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, a);
	kvt_slots_fini(&s);
}

static void
test_double_free_and_range(void **state)
{
	struct kvt_slots s;
	uint32_t a, x, count = 0;

	(void)state;
	assert_int_equal(kvt_slots_init(&s, N), 0);
	assert_int_equal(kvt_slots_alloc(&s, &a), 0);
	assert_int_equal(kvt_slots_free(&s, a), 0);
	assert_int_equal(kvt_slots_free(&s, a), -EINVAL); /* double free */
	assert_true(strstr(kvt_last_error_message(), "double free") != NULL);
	assert_int_equal(kvt_slots_free(&s, N), -EINVAL); /* out of range */
	assert_int_equal(kvt_slots_free(&s, UINT32_MAX), -EINVAL);
	assert_int_equal(kvt_slots_free(&s, 5), -EINVAL); /* never allocated */
	assert_int_equal(kvt_slots_used(&s), 0);
	/* Refused frees did not corrupt the stack: exactly N distinct slots come out. */
	while (kvt_slots_alloc(&s, &x) == 0)
		count++;
	assert_int_equal(count, N);
	assert_int_equal(kvt_slots_used(&s), N);
	kvt_slots_fini(&s);
	kvt_slots_fini(&s); /* harmless twice */
}

static void
test_zero_slots(void **state)
{
	struct kvt_slots s;
	uint32_t x;

	(void)state;
	assert_int_equal(kvt_slots_init(&s, 0), 0);
	assert_int_equal(kvt_slots_alloc(&s, &x), -ENOSPC);
	assert_int_equal(kvt_slots_free(&s, 0), -EINVAL);
	assert_false(kvt_slots_is_used(&s, 0));
	kvt_slots_fini(&s);
	kvt_slots_fini(NULL);
}

/* The owner values live in the free list's entries: an allocated slot keeps what was stored,
 * a free one reads KVT_SLOTS_FREE, and freeing slots with owners set keeps the LIFO order and
 * the count (free + used = capacity); take() rebuilds the list lowest first. */
static void
test_owner_values_and_threaded_list(void **state)
{
	struct kvt_slots s;
	uint32_t a, b, x, i, taken[2] = { 3, 5 };

	(void)state;
	assert_int_equal(kvt_slots_init(&s, N), 0);
	assert_int_equal(kvt_slots_owner(&s, 0), KVT_SLOTS_FREE);
	assert_int_equal(kvt_slots_alloc(&s, &a), 0);
	assert_int_equal(kvt_slots_alloc(&s, &b), 0);
	assert_int_equal(kvt_slots_owner(&s, a), KVT_SLOTS_FREE); /* none stored yet */
	kvt_slots_set_owner(&s, a, 1000);
	kvt_slots_set_owner(&s, b, 2000);
	kvt_slots_set_owner(&s, 7, 3000); /* free: ignored */
	assert_int_equal(kvt_slots_owner(&s, a), 1000);
	assert_int_equal(kvt_slots_owner(&s, b), 2000);
	assert_int_equal(kvt_slots_owner(&s, 7), KVT_SLOTS_FREE);
	assert_int_equal(kvt_slots_owner(&s, N), KVT_SLOTS_FREE); /* out of range */
	assert_int_equal(kvt_slots_free(&s, a), 0);
	assert_int_equal(kvt_slots_owner(&s, a), KVT_SLOTS_FREE);
	assert_int_equal(kvt_slots_used(&s) + s.n_free, N);
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, a); /* last freed first */
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, 2); /* then the untouched list */
	kvt_slots_fini(&s);

	assert_int_equal(kvt_slots_init(&s, N), 0);
	{ /* a slot given twice, or out of range: -EINVAL, nothing changed */
		const uint32_t twice[3] = { 5, 1, 5 }, far[2] = { 1, N };

		assert_int_equal(kvt_slots_take(&s, twice, 3), -EINVAL);
		assert_int_equal(kvt_slots_take(&s, far, 2), -EINVAL);
		assert_int_equal(kvt_slots_used(&s), 0);
		assert_int_equal(s.n_free, N);
		assert_false(kvt_slots_is_used(&s, 1) || kvt_slots_is_used(&s, 5));
	}
	assert_int_equal(kvt_slots_take(&s, taken, 2), 0);
	assert_int_equal(kvt_slots_used(&s), 2);
	for (i = 0; i < N - 2; i++) {
		assert_int_equal(kvt_slots_alloc(&s, &x), 0);
		assert_int_equal(x, i < 3 ? i : i < 4 ? 4 : i + 2);
	}
	assert_int_equal(kvt_slots_alloc(&s, &x), -ENOSPC);
	kvt_slots_fini(&s);
}

/* Shadows: free for counting, handed out only after the free list, claimed back by owner with
 * what they keep, clamped, replaced by a second shadow of the owner, forgotten by take. */
static void
test_shadows(void **state)
{
	struct kvt_slots s;
	uint32_t a, b, x, v;

	(void)state;
	assert_int_equal(kvt_slots_init(&s, 3), 0);
	assert_int_equal(kvt_slots_alloc(&s, &a), 0);
	assert_int_equal(kvt_slots_free_shadow(&s, a, 7, 5), 0); /* not enabled: a plain free */
	assert_int_equal(kvt_slots_claim_shadow(&s, 7, &x, &v), -ENOENT);
	assert_int_equal(kvt_slots_shadow_enable(&s), 0);
	assert_int_equal(kvt_slots_alloc(&s, &a), 0);
	assert_int_equal(kvt_slots_alloc(&s, &b), 0);
	assert_int_equal(kvt_slots_free_shadow(&s, a, 7, 5), 0);
	assert_int_equal(kvt_slots_free_shadow(&s, a, 7, 5), -EINVAL); /* double free */
	assert_int_equal(s.n_free, 2);
	assert_false(kvt_slots_is_used(&s, a));
	/* the free list first: the shadow survives one alloc */
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_true(x != a);
	assert_int_equal(kvt_slots_claim_shadow(&s, 8, &x, &v), -ENOENT); /* another owner */
	kvt_slots_shadow_clamp(&s, 7, 9);                                  /* never raises */
	kvt_slots_shadow_clamp(&s, 7, 3);
	assert_int_equal(kvt_slots_claim_shadow(&s, 7, &x, &v), 0);
	assert_int_equal(x, a);
	assert_int_equal(v, 3);
	assert_true(kvt_slots_is_used(&s, a));
	assert_int_equal(s.n_free, 0);
	assert_int_equal(kvt_slots_claim_shadow(&s, 7, &x, &v), -ENOENT); /* once */
	/* only shadows left: alloc gives one up */
	assert_int_equal(kvt_slots_free_shadow(&s, a, 7, 4), 0);
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, a);
	assert_int_equal(kvt_slots_claim_shadow(&s, 7, &x, &v), -ENOENT);
	assert_int_equal(kvt_slots_alloc(&s, &x), -ENOSPC);
	/* a second shadow of an owner (or one of an owner on the same entry) frees the first */
	assert_int_equal(kvt_slots_free_shadow(&s, a, 7, 4), 0);
	assert_int_equal(kvt_slots_free_shadow(&s, b, 7 + KVT_SLOTS_SHADOWS, 2), 0);
	assert_int_equal(s.n_shadow, 1);
	assert_int_equal(s.n_free, 2);
	assert_int_equal(kvt_slots_claim_shadow(&s, 7, &x, &v), -ENOENT);
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, a); /* the free list's */
	kvt_slots_shadow_clamp(&s, 7 + KVT_SLOTS_SHADOWS, 0); /* 0: onto the free list */
	assert_int_equal(s.n_shadow, 0);
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, b);
	/* take rebuilds the free list with the shadows on it */
	assert_int_equal(kvt_slots_free_shadow(&s, b, 1, 1), 0);
	assert_int_equal(kvt_slots_take(&s, &a, 0), 0);
	assert_int_equal(s.n_shadow, 0);
	assert_int_equal(kvt_slots_claim_shadow(&s, 1, &x, &v), -ENOENT);
	assert_int_equal(kvt_slots_alloc(&s, &x), 0);
	assert_int_equal(x, b);
	kvt_slots_fini(&s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alloc_all_then_enospc),
		cmocka_unit_test(test_first_is_zero_and_lifo_reuse),
		cmocka_unit_test(test_shadows),
		cmocka_unit_test(test_double_free_and_range),
		cmocka_unit_test(test_zero_slots),
		cmocka_unit_test(test_owner_values_and_threaded_list),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
