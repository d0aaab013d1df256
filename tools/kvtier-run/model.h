/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/model.h - a Llama-2 model in llama2.c's checkpoint format, read-only.
 *
 * File format (llama2.c "legacy" / version 0 export, little-endian): a header of 7 int32
 *   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 * (a negative vocab_size means a separate classifier matrix is stored at the end), then float32
 * arrays in this order, every matrix [out][in] row-major:
 *   token_embedding[vocab][dim], rms_att[L][dim], wq[L][dim][dim], wk[L][kv_dim][dim],
 *   wv[L][kv_dim][dim], wo[L][dim][dim], rms_ffn[L][dim], w1[L][hidden][dim],
 *   w2[L][dim][hidden], w3[L][hidden][dim], rms_final[dim],
 *   2 * seq_len * head_size / 2 floats of unused RoPE tables, then wcls[vocab][dim] if separate.
 * with head_size = dim / n_heads and kv_dim = n_kv_heads * head_size.
 */
#ifndef KVTR_MODEL_H
#define KVTR_MODEL_H

#include <stddef.h>
#include <stdint.h>

/** The checkpoint header (vocab_size made positive; see kvtr_model.shared_classifier). */
struct kvtr_config {
	int32_t dim;        /* transformer width */
	int32_t hidden_dim; /* FFN width */
	int32_t n_layers;   /* transformer layers */
	int32_t n_heads;    /* query heads */
	int32_t n_kv_heads; /* key/value heads (GQA when < n_heads) */
	int32_t vocab_size; /* tokens */
	int32_t seq_len;    /* maximum positions */
};

/** Pointers into the weight data (shapes in model.h's header comment). */
struct kvtr_weights {
	const float *tok_emb;   /* [vocab][dim] */
	const float *rms_att;   /* [L][dim] */
	const float *wq;        /* [L][dim][dim] */
	const float *wk;        /* [L][kv_dim][dim] */
	const float *wv;        /* [L][kv_dim][dim] */
	const float *wo;        /* [L][dim][dim] */
	const float *rms_ffn;   /* [L][dim] */
	const float *w1;        /* [L][hidden][dim] */
	const float *w2;        /* [L][dim][hidden] */
	const float *w3;        /* [L][hidden][dim] */
	const float *rms_final; /* [dim] */
	const float *wcls;      /* [vocab][dim]; == tok_emb when shared */
};

/** A loaded (or built-in) model. Read-only after load; safe to share between threads. */
struct kvtr_model {
	struct kvtr_config cfg;   /* header */
	int shared_classifier;    /* 1: wcls is the token embedding (positive vocab_size) */
	uint32_t head_size;       /* dim / n_heads */
	uint32_t kv_dim;          /* n_kv_heads * head_size */
	struct kvtr_weights w;    /* pointers into map or owned */
	void *map;                /* mmap of the checkpoint file (NULL for the built-in model) */
	size_t map_len;           /* its length */
	float *owned;             /* heap weights of the built-in model (NULL for files) */
	char name[256];           /* file path or "built-in" */
};

/**
 * kvtr_model_check_config() - validate a header and compute the file size it implies.
 * @c:     header as read (vocab_size may be negative).
 * @what:  name for messages (the file path).
 * @bytes: receives the exact file size in bytes the header implies (header included).
 * Returns 0 or KVT_EFORMAT with "<what> is not a llama2.c checkpoint: <reason>".
 */
int kvtr_model_check_config(const struct kvtr_config *c, const char *what, uint64_t *bytes);

/**
 * kvtr_model_load() - map and validate a llama2.c checkpoint.
 * @path: file path.
 * @m:    receives the model; free with kvtr_model_free(). Zeroed on failure.
 * Returns 0; -errno when the file cannot be opened/mapped; KVT_EFORMAT when the file is
 * truncated ("model file X is truncated: N bytes, header implies M"), too long, not a
 * llama2.c checkpoint (header out of range, inconsistent heads, non-finite weights).
 */
int kvtr_model_load(const char *path, struct kvtr_model *m);

/**
 * kvtr_model_builtin() - the embedded default: stories260K's geometry (dim 64, hidden 172,
 * 5 layers, 8 heads, 4 KV heads, vocab 512, seq_len 512) with deterministic pseudo-random
 * weights (xorshift64*, fixed seed) scaled so that activations stay finite. It speaks
 * gibberish, identically on every machine.
 * Returns 0 or -ENOMEM.
 */
int kvtr_model_builtin(struct kvtr_model *m);

/** kvtr_model_free() - unmap/free; the struct is zeroed. NULL-safe on zeroed structs. */
void kvtr_model_free(struct kvtr_model *m);

#endif /* KVTR_MODEL_H */
