/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/tokenizer.c - llama2.c's tokenizer: loading tokenizer.bin (validated), the
 * embedded 512-token vocabulary, encode() and decode() with llama2.c's exact behaviour.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "tokenizer.h"
#include "util.h"

#define TOK_MAX_PIECE 65536    /* largest max_token_length accepted */
#define TOK_MAX_FILE (64 << 20) /* largest tokenizer file accepted (bytes) */
#define TOK_BUILTIN_VOCAB 512

struct kvtr_tok_index {
	const char *str; /* the piece */
	int32_t id;      /* its token id */
};

static int
tok_index_cmp(const void *a, const void *b)
{
	const struct kvtr_tok_index *x = a, *y = b;
	int c = strcmp(x->str, y->str);

	if (c)
		return c;
	return (x->id > y->id) - (x->id < y->id);
}

/* The lowest id whose piece equals str, or -1 (llama2.c's str_lookup, deterministic on
 * duplicate pieces). */
static int32_t
tok_lookup(const struct kvtr_tokenizer *t, const char *str)
{
	size_t lo = 0, hi = (size_t)t->vocab_size;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(t->sorted[mid].str, str) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < (size_t)t->vocab_size && strcmp(t->sorted[lo].str, str) == 0)
		return t->sorted[lo].id;
	return -1;
}

static int
tok_alloc(struct kvtr_tokenizer *t, int32_t n)
{
	t->vocab_size = n;
	t->vocab = calloc((size_t)n, sizeof(*t->vocab));
	t->scores = calloc((size_t)n, sizeof(*t->scores));
	t->sorted = calloc((size_t)n, sizeof(*t->sorted));
	if (!t->vocab || !t->scores || !t->sorted)
		return kvtr_err(-ENOMEM, "out of memory for a %d-token vocabulary", n);
	for (int i = 0; i < 256; i++) {
		t->byte_pieces[i * 2] = (unsigned char)i;
		t->byte_pieces[i * 2 + 1] = '\0';
	}
	return 0;
}

/* Sorts the lookup index once every piece is set. */
static void
tok_index_build(struct kvtr_tokenizer *t)
{
	for (int32_t i = 0; i < t->vocab_size; i++) {
		t->sorted[i].str = t->vocab[i];
		t->sorted[i].id = i;
	}
	qsort(t->sorted, (size_t)t->vocab_size, sizeof(*t->sorted), tok_index_cmp);
}

static int
tok_read_file(const char *path, unsigned char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long sz;
	int rc = 0;

	if (!f)
		return kvtr_err(-errno, "cannot open tokenizer %s: %s", path, strerror(errno));
	if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		rc = kvtr_err(-EINVAL, "tokenizer %s is not a regular file", path);
		goto out;
	}
	if (sz > TOK_MAX_FILE) {
		rc = kvtr_err(KVT_EFORMAT, "tokenizer %s is not a llama2.c tokenizer: %ld bytes is "
			      "too large", path, sz);
		goto out;
	}
	*buf = malloc((size_t)sz + 1);
	if (!*buf) {
		rc = kvtr_err(-ENOMEM, "out of memory reading tokenizer %s", path);
		goto out;
	}
	if (sz > 0 && fread(*buf, 1, (size_t)sz, f) != (size_t)sz) {
		rc = kvtr_err(-EIO, "cannot read tokenizer %s", path);
		free(*buf);
		*buf = NULL;
		goto out;
	}
	*len = (size_t)sz;
out:
	fclose(f);
	return rc;
}

/*
 * Walks the records after the 4-byte header: the number of complete, valid records (at most
 * @limit), the offset after them, and 0 / KVT_EFORMAT for a bad record. *partial is set when
 * the data ends inside a record.
 */
static int
tok_scan(const char *path, const unsigned char *b, size_t len, uint32_t max_len, int32_t limit,
	 int32_t *count, size_t *end, int *partial)
{
	size_t off = 4;
	int32_t n = 0;

	*partial = 0;
	while (n < limit && off < len) {
		float score;
		int32_t plen;

		if (len - off < 8) {
			*partial = 1;
			break;
		}
		memcpy(&score, b + off, 4);
		memcpy(&plen, b + off + 4, 4);
		if (!isfinite(score))
			return kvtr_err(KVT_EFORMAT,
					"tokenizer %s: token %d has a non-finite score", path, n);
		if (plen <= 0 || (uint32_t)plen > max_len)
			return kvtr_err(KVT_EFORMAT, "tokenizer %s: token %d has length %d, "
					"outside [1, max_token_length %u]", path, n, plen, max_len);
		if (len - off - 8 < (size_t)plen) {
			*partial = 1;
			break;
		}
		off += 8 + (size_t)plen;
		n++;
	}
	*count = n;
	*end = off;
	return 0;
}

/* Checks the file holds exactly @vocab_size well-formed records. */
static int
tok_validate(const char *path, const unsigned char *b, size_t len, int32_t vocab_size,
	     uint32_t *max_len_out)
{
	int32_t n, extra;
	size_t end, end2;
	int partial, rc;
	int32_t ml;

	if (len < 4)
		return kvtr_err(KVT_EFORMAT, "tokenizer %s is truncated: %zu bytes, shorter than "
				"its 4-byte header", path, len);
	memcpy(&ml, b, 4);
	if (ml < 1 || ml > TOK_MAX_PIECE)
		return kvtr_err(KVT_EFORMAT, "tokenizer %s is not a llama2.c tokenizer: "
				"max_token_length %d is outside [1, %d]", path, ml, TOK_MAX_PIECE);
	rc = tok_scan(path, b, len, (uint32_t)ml, vocab_size, &n, &end, &partial);
	if (rc)
		return rc;
	if (partial)
		return kvtr_err(KVT_EFORMAT, "tokenizer %s is truncated: %zu bytes, token %d of %d "
				"is cut off", path, len, n, vocab_size);
	if (n < vocab_size)
		return kvtr_err(KVT_EFORMAT, "tokenizer %s does not match the model: it has %d "
				"tokens, the model has %d", path, n, vocab_size);
	if (end < len) {
		rc = tok_scan(path, b + end - 4, len - end + 4, (uint32_t)ml, INT32_MAX, &extra,
			      &end2, &partial);
		if (rc == 0 && !partial && extra > 0)
			return kvtr_err(KVT_EFORMAT, "tokenizer %s does not match the model: it "
					"has %lld tokens, the model has %d", path,
					(long long)vocab_size + extra, vocab_size);
		return kvtr_err(KVT_EFORMAT, "tokenizer %s is not a llama2.c tokenizer for this "
				"model: %zu unexpected bytes after token %d", path, len - end,
				vocab_size - 1);
	}
	*max_len_out = (uint32_t)ml;
	return 0;
}

int
kvtr_tokenizer_load(const char *path, int32_t vocab_size, struct kvtr_tokenizer *t)
{
	unsigned char *b = NULL;
	size_t len = 0, off = 4;
	int rc;

	memset(t, 0, sizeof(*t));
	if (vocab_size < 1)
		return kvtr_err(-EINVAL, "tokenizer %s: model vocabulary size %d is invalid", path,
				vocab_size);
	rc = tok_read_file(path, &b, &len);
	if (rc)
		return rc;
	rc = tok_validate(path, b, len, vocab_size, &t->max_token_length);
	if (rc == 0)
		rc = tok_alloc(t, vocab_size);
	for (int32_t i = 0; rc == 0 && i < vocab_size; i++) {
		int32_t plen;

		memcpy(&t->scores[i], b + off, 4);
		memcpy(&plen, b + off + 4, 4);
		t->vocab[i] = malloc((size_t)plen + 1);
		if (!t->vocab[i]) {
			rc = kvtr_err(-ENOMEM, "out of memory loading tokenizer %s", path);
			break;
		}
		memcpy(t->vocab[i], b + off + 8, (size_t)plen);
		t->vocab[i][plen] = '\0';
		off += 8 + (size_t)plen;
	}
	free(b);
	if (rc) {
		kvtr_tokenizer_free(t);
		return rc;
	}
	tok_index_build(t);
	return 0;
}

/* Words of the built-in vocabulary; every prefix of each becomes a piece (so BPE can build it
 * left to right), shorter pieces merging first. */
static const char *const tok_builtin_words[] = {
	" the", " and", " was", " she", " he", " they", " said", " to", " a", " it", " Lily",
	" Tom", " Tim", " Once", " upon", " time", " there", " little", " girl", " boy",
	" named", " play", " happy", " big", " day", " dog", " cat", " ball", " tree", " sun",
	" mom", " friend", " saw", " went", " park", " loved", " with", " her", " his", " you",
	" in", " on", " of", " for", " so", " very", " had", " wanted", " help", " fun", " red",
	" bird", " book", " cake", " home", " sad", " good", " look", " run", " One", " The",
	" She", " He", " They", "ed", "ing", "ly", "er", " kvtier",
};

/* Appends piece p (if new) to the built-in list; returns the new count. */
static int
tok_builtin_add(char pieces[][16], int n, int cap, const char *p)
{
	if (n >= cap)
		return n;
	for (int i = 0; i < n; i++)
		if (strcmp(pieces[i], p) == 0)
			return n;
	snprintf(pieces[n], 16, "%s", p);
	return n + 1;
}

/* The 253 pieces after the 259 special and byte tokens, in a fixed order. */
static int
tok_builtin_pieces(char pieces[][16], int cap)
{
	static const char singles[] = " abcdefghijklmnopqrstuvwxyzTLOSHIAMWB.,!?'\"-\n";
	char tmp[16];
	int n = 0;

	for (const char *c = singles; *c; c++) {
		tmp[0] = *c;
		tmp[1] = '\0';
		n = tok_builtin_add(pieces, n, cap, tmp);
	}
	for (size_t w = 0; w < sizeof(tok_builtin_words) / sizeof(tok_builtin_words[0]); w++) {
		size_t len = strlen(tok_builtin_words[w]);

		for (size_t k = 2; k <= len; k++) {
			memcpy(tmp, tok_builtin_words[w], k);
			tmp[k] = '\0';
			n = tok_builtin_add(pieces, n, cap, tmp);
		}
	}
	for (char a = 'a'; a <= 'z' && n < cap; a++) {
		for (char b = 'a'; b <= 'z' && n < cap; b++) {
			tmp[0] = a;
			tmp[1] = b;
			tmp[2] = '\0';
			n = tok_builtin_add(pieces, n, cap, tmp);
		}
	}
	return n;
}

int
kvtr_tokenizer_builtin(struct kvtr_tokenizer *t)
{
	char pieces[TOK_BUILTIN_VOCAB - 259][16];
	char buf[16];
	int n, rc;

	memset(t, 0, sizeof(*t));
	rc = tok_alloc(t, TOK_BUILTIN_VOCAB);
	n = tok_builtin_pieces(pieces, TOK_BUILTIN_VOCAB - 259);
	for (int i = 0; rc == 0 && i < TOK_BUILTIN_VOCAB; i++) {
		const char *p;

		if (i == 0)
			p = "<unk>";
		else if (i == KVTR_TOKEN_BOS)
			p = "\n<s>\n";
		else if (i == KVTR_TOKEN_EOS)
			p = "\n</s>\n";
		else if (i < 259)
			p = (snprintf(buf, sizeof(buf), "<0x%02X>", i - 3), buf);
		else
			p = i - 259 < n ? pieces[i - 259] : "<unused>";
		t->vocab[i] = strdup(p);
		if (!t->vocab[i])
			rc = kvtr_err(-ENOMEM, "out of memory building the built-in tokenizer");
		/* merge priority: shorter pieces first, then in list order */
		t->scores[i] = i < 259 ? 0.0f : -(float)(strlen(p) * 1000 + (size_t)i);
		if (rc == 0 && strlen(p) > t->max_token_length)
			t->max_token_length = (uint32_t)strlen(p);
	}
	if (rc) {
		kvtr_tokenizer_free(t);
		return rc;
	}
	tok_index_build(t);
	return 0;
}

void
kvtr_tokenizer_free(struct kvtr_tokenizer *t)
{
	if (t->vocab)
		for (int32_t i = 0; i < t->vocab_size; i++)
			free(t->vocab[i]);
	free(t->vocab);
	free(t->scores);
	free(t->sorted);
	memset(t, 0, sizeof(*t));
}

/* Step 1 of encode: code points (or their bytes) to tokens, after BOS and the dummy prefix. */
static void
tok_encode_codepoints(const struct kvtr_tokenizer *t, const char *text, char *buf,
		      int32_t *tokens, uint32_t *n)
{
	size_t len = 0;

	for (const char *c = text; *c != '\0'; c++) {
		int32_t id;

		/* a byte that is not a UTF-8 continuation starts a new code point */
		if ((*c & 0xC0) != 0x80)
			len = 0;
		buf[len++] = *c;
		buf[len] = '\0';
		if ((*(c + 1) & 0xC0) == 0x80 && len < 4)
			continue;
		id = tok_lookup(t, buf);
		if (id != -1) {
			tokens[(*n)++] = id;
		} else {
			/* byte fallback: ids 3..258 are the bytes 0..255 */
			for (size_t i = 0; i < len; i++)
				tokens[(*n)++] = (int32_t)(unsigned char)buf[i] + 3;
		}
		len = 0;
	}
}

int
kvtr_tokenizer_encode(const struct kvtr_tokenizer *t, const char *text, int bos,
		      int32_t *tokens, uint32_t *n)
{
	size_t cap = (size_t)t->max_token_length * 2 + 1 + 2 + 4;
	char *buf = malloc(cap);

	if (!buf)
		return kvtr_err(-ENOMEM, "out of memory encoding a prompt");
	*n = 0;
	if (bos)
		tokens[(*n)++] = KVTR_TOKEN_BOS;
	if (text[0] != '\0') {
		/* sentencepiece's add_dummy_prefix; llama2.c assumes the " " piece exists, we
		 * fall back to the byte token of ' ' when it does not */
		int32_t sp = tok_lookup(t, " ");

		if (sp == -1 && t->vocab_size > ' ' + 3)
			sp = ' ' + 3;
		if (sp != -1)
			tokens[(*n)++] = sp;
	}
	tok_encode_codepoints(t, text, buf, tokens, n);
	/* greedy BPE: merge the best-scoring adjacent pair until none is in the vocabulary */
	for (;;) {
		float best_score = -1e10f;
		int32_t best_id = -1;
		uint32_t best_idx = UINT32_MAX;

		for (uint32_t i = 0; i + 1 < *n; i++) {
			int32_t id;

			snprintf(buf, cap, "%s%s", t->vocab[tokens[i]], t->vocab[tokens[i + 1]]);
			id = tok_lookup(t, buf);
			if (id != -1 && t->scores[id] > best_score) {
				best_score = t->scores[id];
				best_id = id;
				best_idx = i;
			}
		}
		if (best_idx == UINT32_MAX)
			break;
		tokens[best_idx] = best_id;
		for (uint32_t i = best_idx + 1; i + 1 < *n; i++)
			tokens[i] = tokens[i + 1];
		(*n)--;
	}
	free(buf);
	return 0;
}

const char *
kvtr_tokenizer_decode(const struct kvtr_tokenizer *t, int32_t prev, int32_t token)
{
	const char *piece;
	unsigned char byte_val;

	if (token < 0 || token >= t->vocab_size)
		return "";
	piece = t->vocab[token];
	/* after BOS, sentencepiece's decoder strips the leading space */
	if (prev == KVTR_TOKEN_BOS && piece[0] == ' ')
		piece++;
	/* raw byte tokens look like <0x01>: return the byte itself */
	if (sscanf(piece, "<0x%02hhX>", &byte_val) == 1)
		piece = (const char *)t->byte_pieces + byte_val * 2;
	return piece;
}

int
kvtr_piece_printable(const char *piece)
{
	if (piece == NULL || piece[0] == '\0')
		return 0;
	if (piece[1] == '\0') {
		unsigned char b = (unsigned char)piece[0];

		if (!(isprint(b) || isspace(b)))
			return 0;
	}
	return 1;
}
