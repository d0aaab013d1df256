/* SPDX-License-Identifier: MIT */
/*
 * engine/ext.c - the external-pool mode (issue 19 item 1, kvtier.h "External-pool mode").
 * First commit: the entry points of the public contract, refusing with KVT_ENOTSUP until the
 * implementation lands, so that bindings built on the header link and load.
 */
#include <errno.h>
#include <string.h>

#include "engine_impl.h"

#define EXT_TODO(fn) kvt_err(KVT_ENOTSUP, fn ": the external-pool mode is not implemented yet")

void
kvt_ext_opts_init(struct kvt_ext_opts *o, size_t size)
{
	struct kvt_ext_opts d = { 0 };

	if (!o)
		return;
	d.opts_size = size;
	d.max_jobs = 4096;
	memcpy(o, &d, size < sizeof d ? size : sizeof d);
}

int
kvt_ext_register(struct kvt_engine *e, const struct kvt_ext_opts *o, uint32_t *pool)
{
	(void)e, (void)o;
	if (pool)
		*pool = 0;
	return EXT_TODO("kvt_ext_register");
}

int
kvt_ext_unregister(struct kvt_engine *e, uint32_t pool)
{
	(void)e, (void)pool;
	return EXT_TODO("kvt_ext_unregister");
}

int
kvt_ext_store(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	      const uint32_t *block_ids, size_t n, void *stream, uint64_t *job)
{
	(void)e, (void)pool, (void)tenant, (void)hashes, (void)block_ids, (void)n, (void)stream;
	if (job)
		*job = 0;
	return EXT_TODO("kvt_ext_store");
}

int
kvt_ext_lookup(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	       size_t n, size_t *hits, enum kvt_tier *tier)
{
	(void)e, (void)pool, (void)tenant, (void)hashes, (void)n, (void)tier;
	if (hits)
		*hits = 0;
	return EXT_TODO("kvt_ext_lookup");
}

int
kvt_ext_load(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	     const uint32_t *block_ids, size_t n, uint32_t flags, uint64_t *job)
{
	(void)e, (void)pool, (void)tenant, (void)hashes, (void)block_ids, (void)n, (void)flags;
	if (job)
		*job = 0;
	return EXT_TODO("kvt_ext_load");
}

int
kvt_ext_poll(struct kvt_engine *e, uint32_t pool, struct kvt_ext_done *done, size_t cap,
	     struct kvt_ext_fail *fails, size_t fails_cap)
{
	(void)e, (void)pool, (void)done, (void)cap, (void)fails, (void)fails_cap;
	return EXT_TODO("kvt_ext_poll");
}

int
kvt_ext_wait(struct kvt_engine *e, uint32_t pool, uint64_t job, uint32_t timeout_ms)
{
	(void)e, (void)pool, (void)job, (void)timeout_ms;
	return EXT_TODO("kvt_ext_wait");
}

int
kvt_ext_wait_layer(struct kvt_engine *e, uint32_t pool, uint64_t job, uint32_t layer,
		   void *stream)
{
	(void)e, (void)pool, (void)job, (void)layer, (void)stream;
	return EXT_TODO("kvt_ext_wait_layer");
}

int
kvt_ext_touch(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	      size_t n)
{
	(void)e, (void)pool, (void)tenant, (void)hashes, (void)n;
	return EXT_TODO("kvt_ext_touch");
}

int
kvt_ext_drop(struct kvt_engine *e, uint32_t pool, uint32_t tenant, const uint64_t *hashes,
	     size_t n)
{
	(void)e, (void)pool, (void)tenant, (void)hashes, (void)n;
	return EXT_TODO("kvt_ext_drop");
}

int
kvt_ext_stats(struct kvt_engine *e, uint32_t pool, struct kvt_ext_stats *out)
{
	(void)e, (void)pool, (void)out;
	return EXT_TODO("kvt_ext_stats");
}
