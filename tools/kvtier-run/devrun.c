/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/devrun.c - the --device cuda path of kvtier-run: kvtier's HBM is GPU memory,
 * so the new K/V of a position is converted to kv_dtype on the host and copied to its slot
 * with cudaMemcpy, and attention over HBM blocks runs with the CUDA kernel
 * (kvt_attn_decode_cuda / kvt_attn_partial_cuda, one split) after the block table and query
 * are copied to the device; its result is copied back. Matmuls stay on the CPU.
 *
 * Ordering: every copy here is a synchronous cudaMemcpy and the kernels run on the legacy
 * default stream, whose result copy waits for them, so when a function returns its GPU work is
 * complete: the runner waits for kvtier's copies with kvt_batch_wait_layer(b, l, NULL) before
 * and releases with a NULL stream after, exactly as on the emulated device.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "run_int.h"

#ifdef KVT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/kernels_cuda.h"

/* Device buffers of the CUDA path. */
struct run_dev {
	float *q;        /* device [dim] query */
	float *out;      /* device [dim] attention output */
	float *ml;       /* device [2][n_heads] partial max and sum */
	uint32_t *table; /* device [max blocks] block table row */
	uint32_t max_blocks; /* entries of table */
	void *tok;       /* host [2][token_bytes] K/V as stored */
};

static int
dev_cuda_err(cudaError_t e, const char *what)
{
	return kvtr_err(KVT_EDEVICE, "%s: %s (%s)", what, cudaGetErrorString(e),
			cudaGetErrorName(e));
}

int
run_dev_init(struct run_ctx *c)
{
	const size_t dim = (size_t)c->m->cfg.dim, nh = (size_t)c->m->cfg.n_heads;
	struct run_dev *d;
	cudaError_t e;

	if (c->o->device != KVT_DEVICE_CUDA || c->o->reference)
		return 0;
	d = calloc(1, sizeof(*d));
	if (!d)
		return kvtr_err(-ENOMEM, "out of memory for the CUDA path");
	c->dev = d;
	d->max_blocks = ((uint32_t)c->m->cfg.seq_len + c->geo.tokens_per_block - 1) /
			c->geo.tokens_per_block + 1;
	d->tok = calloc(2, c->geo.token_bytes);
	if (!d->tok)
		return kvtr_err(-ENOMEM, "out of memory for the CUDA path");
	if ((e = cudaMalloc((void **)&d->q, dim * sizeof(float))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&d->out, dim * sizeof(float))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&d->ml, 2 * nh * sizeof(float))) != cudaSuccess ||
	    (e = cudaMalloc((void **)&d->table, d->max_blocks * sizeof(uint32_t))) != cudaSuccess)
		return dev_cuda_err(e, "cudaMalloc (kvtier-run CUDA buffers)");
	return 0;
}

void
run_dev_fini(struct run_ctx *c)
{
	struct run_dev *d = c->dev;

	if (!d)
		return;
	cudaFree(d->q);
	cudaFree(d->out);
	cudaFree(d->ml);
	cudaFree(d->table);
	free(d->tok);
	free(d);
	c->dev = NULL;
}

int
run_dev_owns(const struct run_ctx *c, const void *p)
{
	const char *b = c->geo.hbm_base;

	return c->dev && (const char *)p >= b &&
	       (const char *)p < b + (uint64_t)c->geo.hbm_slots * c->geo.block_bytes;
}

int
run_dev_store(struct run_ctx *c, void *k, void *v, const float *kf, const float *vf)
{
	struct run_dev *d = c->dev;
	size_t tb = c->geo.token_bytes;
	cudaError_t e;
	int rc;

	rc = kvt_store_f32(c->o->kv_dtype, d->tok, kf, c->m->kv_dim);
	if (rc == 0)
		rc = kvt_store_f32(c->o->kv_dtype, (char *)d->tok + tb, vf, c->m->kv_dim);
	if (rc)
		return kvtr_err(rc, "kvt_store_f32: cannot store K/V as dtype %d", c->o->kv_dtype);
	if ((e = cudaMemcpy(k, d->tok, tb, cudaMemcpyHostToDevice)) != cudaSuccess ||
	    (e = cudaMemcpy(v, (char *)d->tok + tb, tb, cudaMemcpyHostToDevice)) != cudaSuccess)
		return dev_cuda_err(e, "cudaMemcpy of new K/V into HBM");
	return 0;
}

int
run_dev_attn(struct run_ctx *c, const struct kvt_paged_kv *kv, const float *q, uint64_t len,
	     float *out, float *ml)
{
	struct run_dev *d = c->dev;
	const uint32_t nh = (uint32_t)c->m->cfg.n_heads, nb =
		(uint32_t)((len + kv->tokens_per_block - 1) / kv->tokens_per_block);
	const size_t dim = (size_t)nh * kv->head_dim;
	struct kvt_paged_kv dkv = *kv;
	cudaError_t e;
	int rc;

	if (nb > d->max_blocks)
		return kvtr_err(-EINVAL, "internal: %u blocks in one attention (at most %u)", nb,
				d->max_blocks);
	if ((e = cudaMemcpy(d->table, kv->table, nb * sizeof(uint32_t),
			    cudaMemcpyHostToDevice)) != cudaSuccess ||
	    (e = cudaMemcpy(d->q, q, dim * sizeof(float), cudaMemcpyHostToDevice)) != cudaSuccess)
		return dev_cuda_err(e, "cudaMemcpy of a block table and query");
	dkv.table = d->table;
	if (ml)
		rc = kvt_attn_partial_cuda(&dkv, d->q, nh, 0, len, d->out, d->ml, d->ml + nh, NULL);
	else
		rc = kvt_attn_decode_cuda(&dkv, d->q, nh, len, 1, NULL, d->out, NULL);
	if (rc)
		return kvtr_err_kvt(rc, "CUDA attention");
	if ((e = cudaMemcpy(out, d->out, dim * sizeof(float), cudaMemcpyDeviceToHost)) ||
	    (ml && (e = cudaMemcpy(ml, d->ml, 2 * nh * sizeof(float), cudaMemcpyDeviceToHost))))
		return dev_cuda_err(e, "cudaMemcpy of the attention result");
	return 0;
}
#else /* !KVT_WITH_CUDA: the engine refuses KVT_DEVICE_CUDA first (KVT_ENOTSUP) */
int
run_dev_init(struct run_ctx *c)
{
	if (c->o->device == KVT_DEVICE_CUDA && !c->o->reference)
		return kvtr_err(KVT_ENOTSUP, "--device cuda: this build has no CUDA");
	return 0;
}

void
run_dev_fini(struct run_ctx *c)
{
	(void)c;
}

int
run_dev_owns(const struct run_ctx *c, const void *p)
{
	(void)c;
	(void)p;
	return 0;
}

int
run_dev_store(struct run_ctx *c, void *k, void *v, const float *kf, const float *vf)
{
	(void)c, (void)k, (void)v, (void)kf, (void)vf;
	return kvtr_err(KVT_ENOTSUP, "--device cuda: this build has no CUDA");
}

int
run_dev_attn(struct run_ctx *c, const struct kvt_paged_kv *kv, const float *q, uint64_t len,
	     float *out, float *ml)
{
	(void)c, (void)kv, (void)q, (void)len, (void)out, (void)ml;
	return kvtr_err(KVT_ENOTSUP, "--device cuda: this build has no CUDA");
}
#endif
