/* SPDX-License-Identifier: MIT */
/* tools/kvtier-run/model.c - llama2.c checkpoint loader/validator and the built-in model. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "util.h"

#define MODEL_HEADER_BYTES ((uint64_t)sizeof(struct kvtr_config))

/* Sane ranges: generous for real Llama models, tight enough that a foreign file is caught. */
#define MODEL_MAX_DIM 65536
#define MODEL_MAX_HIDDEN (1 << 20)
#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_HEADS 1024
#define MODEL_MAX_VOCAB (1 << 22)
#define MODEL_MAX_SEQ (1 << 22)

/* Offsets (in floats, after the header) of every array; see model.h. */
struct model_layout {
	uint64_t tok_emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq, wcls;
	uint64_t n_floats; /* total floats after the header */
};

static int
model_bad(const char *what, const char *reason)
{
	return kvtr_err(KVT_EFORMAT, "%s is not a llama2.c checkpoint: %s", what, reason);
}

static int
model_check_range(const char *what, const char *field, int64_t v, int64_t lo, int64_t hi)
{
	char reason[160];

	if (v >= lo && v <= hi)
		return 0;
	snprintf(reason, sizeof(reason), "header field %s = %lld is outside [%lld, %lld]", field,
		 (long long)v, (long long)lo, (long long)hi);
	return model_bad(what, reason);
}

static void
model_layout_compute(const struct kvtr_config *c, int shared, struct model_layout *lo)
{
	uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
	uint64_t hs = dim / (uint64_t)c->n_heads, kv_dim = hs * (uint64_t)c->n_kv_heads;
	uint64_t V = (uint64_t)(c->vocab_size < 0 ? -(int64_t)c->vocab_size : c->vocab_size);
	uint64_t off = 0;

	lo->tok_emb = off;
	off += V * dim;
	lo->rms_att = off;
	off += L * dim;
	lo->wq = off;
	off += L * dim * dim;
	lo->wk = off;
	off += L * dim * kv_dim;
	lo->wv = off;
	off += L * dim * kv_dim;
	lo->wo = off;
	off += L * dim * dim;
	lo->rms_ffn = off;
	off += L * dim;
	lo->w1 = off;
	off += L * dim * hid;
	lo->w2 = off;
	off += L * hid * dim;
	lo->w3 = off;
	off += L * dim * hid;
	lo->rms_final = off;
	off += dim;
	lo->freq = off;
	off += 2 * ((uint64_t)c->seq_len * hs / 2);
	lo->wcls = shared ? lo->tok_emb : off;
	if (!shared)
		off += V * dim;
	lo->n_floats = off;
}

int
kvtr_model_check_config(const struct kvtr_config *c, const char *what, uint64_t *bytes)
{
	struct model_layout lo;
	int64_t vocab = c->vocab_size < 0 ? -(int64_t)c->vocab_size : c->vocab_size;
	int rc;

	if ((rc = model_check_range(what, "dim", c->dim, 2, MODEL_MAX_DIM)) ||
	    (rc = model_check_range(what, "hidden_dim", c->hidden_dim, 1, MODEL_MAX_HIDDEN)) ||
	    (rc = model_check_range(what, "n_layers", c->n_layers, 1, MODEL_MAX_LAYERS)) ||
	    (rc = model_check_range(what, "n_heads", c->n_heads, 1, MODEL_MAX_HEADS)) ||
	    (rc = model_check_range(what, "n_kv_heads", c->n_kv_heads, 1, MODEL_MAX_HEADS)) ||
	    (rc = model_check_range(what, "vocab_size (absolute)", vocab, 3, MODEL_MAX_VOCAB)) ||
	    (rc = model_check_range(what, "seq_len", c->seq_len, 1, MODEL_MAX_SEQ)))
		return rc;
	if (c->dim % c->n_heads != 0) {
		char reason[128];

		snprintf(reason, sizeof(reason), "dim %d is not divisible by n_heads %d", c->dim,
			 c->n_heads);
		return model_bad(what, reason);
	}
	if (c->n_heads % c->n_kv_heads != 0) {
		char reason[128];

		snprintf(reason, sizeof(reason), "n_heads %d is not a multiple of n_kv_heads %d",
			 c->n_heads, c->n_kv_heads);
		return model_bad(what, reason);
	}
	if ((c->dim / c->n_heads) % 2 != 0)
		return model_bad(what, "head size is odd (RoPE rotates pairs)");
	model_layout_compute(c, c->vocab_size > 0, &lo);
	*bytes = MODEL_HEADER_BYTES + lo.n_floats * sizeof(float);
	return 0;
}

static void
model_set_weights(struct kvtr_model *m, const float *base, const struct model_layout *lo)
{
	struct kvtr_weights *w = &m->w;

	w->tok_emb = base + lo->tok_emb;
	w->rms_att = base + lo->rms_att;
	w->wq = base + lo->wq;
	w->wk = base + lo->wk;
	w->wv = base + lo->wv;
	w->wo = base + lo->wo;
	w->rms_ffn = base + lo->rms_ffn;
	w->w1 = base + lo->w1;
	w->w2 = base + lo->w2;
	w->w3 = base + lo->w3;
	w->rms_final = base + lo->rms_final;
	w->wcls = base + lo->wcls;
	m->head_size = (uint32_t)(m->cfg.dim / m->cfg.n_heads);
	m->kv_dim = m->head_size * (uint32_t)m->cfg.n_kv_heads;
}

/* Every weight must be a finite number: NaN/Inf means the bytes are not weights. */
static int
model_check_finite(const char *what, const float *f, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		if (!isfinite(f[i])) {
			char reason[128];

			snprintf(reason, sizeof(reason),
				 "weight %llu (byte offset %llu) is not finite",
				 (unsigned long long)i,
				 (unsigned long long)(MODEL_HEADER_BYTES + i * sizeof(float)));
			return model_bad(what, reason);
		}
	}
	return 0;
}

/* Reads the header and validates it against the file size. */
static int
model_read_header(int fd, const char *path, uint64_t size, struct kvtr_config *c)
{
	uint64_t want;
	ssize_t got;
	int rc;

	if (size < MODEL_HEADER_BYTES)
		return kvtr_err(KVT_EFORMAT, "model file %s is truncated: %llu bytes, header "
				"implies at least %llu", path, (unsigned long long)size,
				(unsigned long long)MODEL_HEADER_BYTES);
	got = pread(fd, c, sizeof(*c), 0);
	if (got != (ssize_t)sizeof(*c))
		return kvtr_err(got < 0 ? -errno : -EIO,
				"model file %s: cannot read the header: %s", path,
				got < 0 ? strerror(errno) : "short read");
	if (memcmp(c, "GGUF", 4) == 0)
		return kvtr_err(KVT_EFORMAT, "%s is not a llama2.c checkpoint: it is a GGUF file "
				"(llama.cpp's format); --model expects a llama2.c checkpoint (e.g. "
				"stories260K.bin, as llama2.c's export.py writes it)", path);
	rc = kvtr_model_check_config(c, path, &want);
	if (rc)
		return rc;
	if (size < want)
		return kvtr_err(KVT_EFORMAT, "model file %s is truncated: %llu bytes, header "
				"implies %llu", path, (unsigned long long)size,
				(unsigned long long)want);
	if (size > want) {
		char reason[160];

		snprintf(reason, sizeof(reason), "%llu bytes, but the header implies exactly %llu",
			 (unsigned long long)size, (unsigned long long)want);
		return model_bad(path, reason);
	}
	return 0;
}

int
kvtr_model_load(const char *path, struct kvtr_model *m)
{
	struct model_layout lo;
	struct stat st;
	void *map;
	int fd, rc;

	memset(m, 0, sizeof(*m));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return kvtr_err(-errno, "cannot open model file %s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = kvtr_err(-EINVAL, "model file %s is not a regular file", path);
		goto out;
	}
	rc = model_read_header(fd, path, (uint64_t)st.st_size, &m->cfg);
	if (rc)
		goto out;
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = kvtr_err(-errno, "cannot map model file %s: %s", path, strerror(errno));
		goto out;
	}
	m->map = map;
	m->map_len = (size_t)st.st_size;
	m->shared_classifier = m->cfg.vocab_size > 0;
	model_layout_compute(&m->cfg, m->shared_classifier, &lo);
	if (m->cfg.vocab_size < 0)
		m->cfg.vocab_size = -m->cfg.vocab_size;
	model_set_weights(m, (const float *)((const char *)map + MODEL_HEADER_BYTES), &lo);
	rc = model_check_finite(path, (const float *)((const char *)map + MODEL_HEADER_BYTES),
				lo.n_floats);
	if (rc)
		goto out;
	snprintf(m->name, sizeof(m->name), "%s", path);
out:
	close(fd);
	if (rc)
		kvtr_model_free(m);
	return rc;
}

/* xorshift64* (Vigna 2016): a tiny deterministic generator for the built-in weights. */
static uint64_t
model_rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(0x2545F4914F6CDD1D);
}

/* Uniform in [-1, 1). */
static float
model_rng_uniform(uint64_t *s)
{
	return (float)((model_rng_next(s) >> 40) / 8388608.0 - 1.0);
}

static void
model_fill(float *dst, uint64_t n, float scale, float bias, uint64_t *rng)
{
	for (uint64_t i = 0; i < n; i++)
		dst[i] = bias + scale * model_rng_uniform(rng);
}

int
kvtr_model_builtin(struct kvtr_model *m)
{
	/* negative vocab_size: a classifier of its own (llama2.c's convention) */
	const struct kvtr_config c = { 64, 172, 5, 8, 4, -512, 512 };
	struct model_layout lo;
	uint64_t rng = UINT64_C(0x6b76746965722d31); /* "kvtier-1" */
	float *f;
	float sd = 1.0f / sqrtf((float)c.dim), sh = 1.0f / sqrtf((float)c.hidden_dim);
	uint64_t L = (uint64_t)c.n_layers, dim = (uint64_t)c.dim, hid = (uint64_t)c.hidden_dim;
	uint64_t V = 512;

	memset(m, 0, sizeof(*m));
	model_layout_compute(&c, 0, &lo);
	f = calloc(lo.n_floats, sizeof(float));
	if (!f)
		return kvtr_err(-ENOMEM, "out of memory for the built-in model (%llu floats)",
				(unsigned long long)lo.n_floats);
	m->cfg = c;
	m->cfg.vocab_size = (int32_t)V;
	m->shared_classifier = 0;
	m->owned = f;
	model_set_weights(m, f, &lo);
	/* Embeddings of unit-ish scale; projections scaled 1/sqrt(fan_in) so the residual
	 * stream stays O(1); norms around 1. The RoPE tables stay zero (unused). */
	model_fill(f + lo.tok_emb, V * dim, 1.0f, 0.0f, &rng);
	model_fill(f + lo.rms_att, L * dim, 0.1f, 1.0f, &rng);
	model_fill(f + lo.wq, L * dim * dim, sd, 0.0f, &rng);
	model_fill(f + lo.wk, L * dim * m->kv_dim, sd, 0.0f, &rng);
	model_fill(f + lo.wv, L * dim * m->kv_dim, sd, 0.0f, &rng);
	model_fill(f + lo.wo, L * dim * dim, sd, 0.0f, &rng);
	model_fill(f + lo.rms_ffn, L * dim, 0.1f, 1.0f, &rng);
	model_fill(f + lo.w1, L * dim * hid, sd, 0.0f, &rng);
	model_fill(f + lo.w2, L * hid * dim, sh, 0.0f, &rng);
	model_fill(f + lo.w3, L * dim * hid, sd, 0.0f, &rng);
	model_fill(f + lo.rms_final, dim, 0.1f, 1.0f, &rng);
	/* The classifier: peaked logits (scale 4) over the word pieces; the rows of <unk>, BOS,
	 * EOS and the 256 byte tokens stay zero, so the model keeps talking (a BOS would end the
	 * text) and prints pieces rather than raw bytes. */
	model_fill(f + lo.wcls + 259 * dim, (V - 259) * dim, 4.0f * sd, 0.0f, &rng);
	snprintf(m->name, sizeof(m->name), "built-in");
	return 0;
}

void
kvtr_model_free(struct kvtr_model *m)
{
	if (m->map)
		munmap(m->map, m->map_len);
	free(m->owned);
	memset(m, 0, sizeof(*m));
}
