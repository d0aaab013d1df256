/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/tokenizer.h - llama2.c's BPE tokenizer (tokenizer.bin format).
 *
 * File format: int32 max_token_length, then for every token: float32 score, int32 byte length,
 * the bytes (no terminator). The vocabulary size is not stored: it must equal the model's, so
 * the loader reads to the end of the file and compares.
 * Conventions (sentencepiece as exported by llama2.c): id 0 <unk>, 1 BOS "\n<s>\n",
 * 2 EOS "\n</s>\n", 3..258 byte-fallback tokens spelled <0xNN>.
 */
#ifndef KVTR_TOKENIZER_H
#define KVTR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define KVTR_TOKEN_BOS 1 /* begin of sequence; also the stop token of generation */
#define KVTR_TOKEN_EOS 2 /* end of sequence */

struct kvtr_tok_index; /* sorted (piece, id) pairs for lookups; private */

/** A tokenizer. Read-only after load; safe to share between threads. */
struct kvtr_tokenizer {
	char **vocab;                 /* [vocab_size] NUL-terminated pieces */
	float *scores;                /* [vocab_size] merge scores */
	int32_t vocab_size;           /* tokens */
	uint32_t max_token_length;    /* longest piece in bytes */
	struct kvtr_tok_index *sorted; /* [vocab_size] pieces sorted by strcmp, then id */
	unsigned char byte_pieces[512]; /* "\xNN\0" for every byte, as llama2.c's decode() */
};

/**
 * kvtr_tokenizer_load() - read a tokenizer.bin.
 * @path:       file path.
 * @vocab_size: the model's vocabulary size; the file must hold exactly that many tokens.
 * @t:          receives the tokenizer; free with kvtr_tokenizer_free(). Zeroed on failure.
 * Returns 0, -errno (cannot open), -ENOMEM, KVT_EFORMAT: "tokenizer X is truncated ...",
 * "tokenizer X does not match the model: it has N tokens, the model has M", or a bad field.
 */
int kvtr_tokenizer_load(const char *path, int32_t vocab_size, struct kvtr_tokenizer *t);

/**
 * kvtr_tokenizer_builtin() - the embedded 512-token tokenizer of the built-in model: <unk>,
 * BOS, EOS, the 256 byte tokens, then short English pieces and words with scores.
 * Returns 0 or -ENOMEM.
 */
int kvtr_tokenizer_builtin(struct kvtr_tokenizer *t);

/** kvtr_tokenizer_free() - free everything; the struct is zeroed. Safe on a zeroed struct. */
void kvtr_tokenizer_free(struct kvtr_tokenizer *t);

/**
 * kvtr_tokenizer_encode() - llama2.c's encode(): optional BOS, then (when @text is not empty)
 * the dummy-prefix piece " ", then every UTF-8 code point as its piece or, when absent, its
 * bytes as byte tokens (+3), then greedy merges of the best-scoring adjacent pair.
 * @text:   NUL-terminated UTF-8 (any bytes are accepted).
 * @bos:    1 to prepend BOS (id 1).
 * @tokens: out; room for strlen(text) + 2 entries.
 * @n:      receives the count.
 * Returns 0 or -ENOMEM.
 */
int kvtr_tokenizer_encode(const struct kvtr_tokenizer *t, const char *text, int bos,
			  int32_t *tokens, uint32_t *n);

/**
 * kvtr_tokenizer_decode() - llama2.c's decode(): the piece printed for @token after @prev:
 * after BOS a leading space is dropped; <0xNN> pieces become that single raw byte.
 * Returns a pointer into @t (valid while @t lives), never NULL; "" for an out-of-range id.
 */
const char *kvtr_tokenizer_decode(const struct kvtr_tokenizer *t, int32_t prev, int32_t token);

/**
 * kvtr_piece_printable() - llama2.c's safe_printf() filter: 0 for an empty piece and for a
 * single byte that is neither printable nor whitespace (control codes from byte tokens).
 */
int kvtr_piece_printable(const char *piece);

#endif /* KVTR_TOKENIZER_H */
