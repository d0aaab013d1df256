/* SPDX-License-Identifier: MIT */
/*
 * tests/test_run_model.c - kvtier-run's modules: size/number parsing, the llama2.c model loader
 * (built-in model, file round trip, every bad file), the tokenizer (encode/decode as llama2.c,
 * bad files), the sampler (llama2.c's rng and rules), the forward pass (paged through kvtier ==
 * contiguous), and the bad inputs of a run (NVMe directory, tier sizes, a sequence used after
 * close, sizes on the command line). Tests needing ../shared/data skip themselves visibly.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "support/kvt_test.h"
#include "support/run_util.h"
#include "kernels/attention.h"
#include "tools/kvtier-run/forward.h"
#include "tools/kvtier-run/model.h"
#include "tools/kvtier-run/runner.h"
#include "tools/kvtier-run/sampler.h"
#include "tools/kvtier-run/tokenizer.h"
#include "tools/kvtier-run/util.h"

static char *tmp_dir;

static int
setup(void **state)
{
	(void)state;
	tmp_dir = tsup_mkdtemp();
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	tsup_rmdir(tmp_dir);
	tmp_dir = NULL;
	return 0;
}

static const char *
tmp_path(const char *name)
{
	static char buf[4][1024];
	static int next;
	char *p = buf[next++ % 4];

	snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
	return p;
}

static void
assert_msg_contains(const char *needle)
{
	if (!strstr(kvtr_last_error(), needle))
		fail_msg("message \"%s\" lacks \"%s\"", kvtr_last_error(), needle);
}

/* ---- parsing ---------------------------------------------------------------------------- */

static void
test_parse_size_ok(void **state)
{
	uint64_t v = 0;

	(void)state;
	assert_int_equal(kvtr_parse_size("--hbm", "5", &v), 0);
	assert_int_equal(v, 5);
	assert_int_equal(kvtr_parse_size("--hbm", "1k", &v), 0);
	assert_int_equal(v, 1024);
	assert_int_equal(kvtr_parse_size("--hbm", "64M", &v), 0);
	assert_int_equal(v, UINT64_C(64) << 20);
	assert_int_equal(kvtr_parse_size("--hbm", "3G", &v), 0);
	assert_int_equal(v, UINT64_C(3) << 30);
	/* the cap is the engine's: 1 PiB per tier */
	assert_int_equal(KVTR_SIZE_MAX, UINT64_C(1) << 50);
	assert_int_equal(kvtr_parse_size("--hbm", "1048576G", &v), 0);
	assert_int_equal(v, KVTR_SIZE_MAX);
	assert_int_equal(kvtr_parse_size("--nvme", "20000G", &v), 0);
	assert_int_equal(v, UINT64_C(20000) << 30);
	/* one syntax for every tool: T and P, fractions, iB/B spellings */
	assert_int_equal(kvtr_parse_size("--nvme", "4T", &v), 0);
	assert_int_equal(v, UINT64_C(4) << 40);
	assert_int_equal(kvtr_parse_size("--hbm", "1.5G", &v), 0);
	assert_int_equal(v, UINT64_C(3) << 29);
	assert_int_equal(kvtr_parse_size("--hbm", "1.5M", &v), 0);
	assert_int_equal(v, UINT64_C(3) << 19);
	assert_int_equal(kvtr_parse_size("--hbm", "1KB", &v), 0);
	assert_int_equal(v, 1024);
	assert_int_equal(kvtr_parse_size("--hbm", "2MiB", &v), 0);
	assert_int_equal(v, UINT64_C(2) << 20);
	assert_int_equal(kvtr_parse_size("--hbm", "1p", &v), 0);
	assert_int_equal(v, KVTR_SIZE_MAX);
	assert_int_equal(kvtr_parse_size("--hbm", "100B", &v), 0);
	assert_int_equal(v, 100);
	assert_int_equal(kvtr_parse_bytes("--x", "0", 0, UINT64_MAX, &v), 0);
	assert_int_equal(v, 0);
}

static void
test_parse_size_bad(void **state)
{
	static const char *const bad[] = {
		"", "0", "0K", "-1", "+1", "12X", " 1", "1 ", "K", "abc", "1.", ".5G", "1.5",
		"1.3K", "1KX", "2P", "1048577G", "1125899906842625", "99999999999G",
		"18446744073709551616",
	};
	uint64_t v = 77;

	(void)state;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_int_equal(kvtr_parse_size("--host", bad[i], &v), -EINVAL);
		assert_msg_contains("--host");
		assert_int_equal(v, 77);
	}
	assert_int_equal(kvtr_parse_size("--nvme", "0", &v), -EINVAL);
	assert_msg_contains("greater than zero");
	assert_int_equal(kvtr_parse_size("--nvme", "2000000G", &v), -EINVAL);
	assert_msg_contains("out of range (more than 1 PiB");
	/* more digits than 64 bits hold: out of range too, not "not a size" */
	assert_int_equal(kvtr_parse_size("--nvme", "99999999999999999999", &v), -EINVAL);
	assert_msg_contains("out of range (more than 1 PiB");
	assert_int_equal(kvtr_parse_size("--nvme", "4X", &v), -EINVAL);
	assert_msg_contains("unknown suffix 'X' (use K, M, G, T or P");
	assert_int_equal(kvtr_parse_size("--nvme", "1.3K", &v), -EINVAL);
	assert_msg_contains("not a whole number of bytes");
}

static void
test_parse_numbers(void **state)
{
	uint32_t u = 0;
	float f = 0.0f;

	(void)state;
	assert_int_equal(kvtr_parse_u32("--steps", "200", 0, 1000, &u), 0);
	assert_int_equal(u, 200);
	assert_int_equal(kvtr_parse_u32("--steps", "1001", 0, 1000, &u), -EINVAL);
	assert_int_equal(kvtr_parse_u32("--steps", "-1", 0, 1000, &u), -EINVAL);
	assert_int_equal(kvtr_parse_u32("--steps", "1e3", 0, 1000, &u), -EINVAL);
	assert_int_equal(kvtr_parse_u32("--sessions", "0", 1, 10, &u), -EINVAL);
	assert_msg_contains("out of range");
	/* overflowing digits are out of range, not "not an integer" */
	assert_int_equal(kvtr_parse_u32("--steps", "99999999999999999999", 0, 1000, &u),
			 -EINVAL);
	assert_msg_contains("--steps: 99999999999999999999 is out of range [0, 1000]");
	assert_int_equal(kvtr_parse_u32("--steps", "4294967296", 0, 1000, &u), -EINVAL);
	assert_msg_contains("out of range");
	assert_int_equal(u, 200);
	assert_int_equal(kvtr_parse_float("--temperature", "0.5", 0.0f, 10.0f, &f), 0);
	assert_true(f == 0.5f);
	assert_int_equal(kvtr_parse_float("--temperature", "nan", 0.0f, 10.0f, &f), -EINVAL);
	assert_int_equal(kvtr_parse_float("--temperature", "-1", 0.0f, 10.0f, &f), -EINVAL);
	assert_int_equal(kvtr_parse_float("--temperature", "1x", 0.0f, 10.0f, &f), -EINVAL);
}

/* ---- model ------------------------------------------------------------------------------ */

/* The built-in model as a llama2.c checkpoint file; returns its size. */
static size_t
write_builtin_model(const char *path, size_t keep, int extra, int nan_at)
{
	struct kvtr_model m;
	uint64_t bytes;
	char *buf;

	assert_int_equal(kvtr_model_builtin(&m), 0);
	m.cfg.vocab_size = -m.cfg.vocab_size; /* separate classifier, as in the file */
	assert_int_equal(kvtr_model_check_config(&m.cfg, "built-in", &bytes), 0);
	buf = calloc(1, bytes + 16);
	assert_non_null(buf);
	memcpy(buf, &m.cfg, sizeof m.cfg);
	memcpy(buf + sizeof m.cfg, m.owned, bytes - sizeof m.cfg);
	if (nan_at >= 0) {
		float nan = NAN;

		memcpy(buf + sizeof m.cfg + (size_t)nan_at * 4, &nan, 4);
	}
	rutil_write_file(path, buf, keep ? keep : bytes + (size_t)extra);
	free(buf);
	kvtr_model_free(&m);
	return bytes;
}

static void
test_builtin_model(void **state)
{
	struct kvtr_model a, b;
	uint64_t bytes, n;

	(void)state;
	assert_int_equal(kvtr_model_builtin(&a), 0);
	assert_int_equal(kvtr_model_builtin(&b), 0);
	assert_int_equal(a.cfg.dim, 64);
	assert_int_equal(a.cfg.hidden_dim, 172);
	assert_int_equal(a.cfg.n_layers, 5);
	assert_int_equal(a.cfg.n_heads, 8);
	assert_int_equal(a.cfg.n_kv_heads, 4);
	assert_int_equal(a.cfg.vocab_size, 512);
	assert_int_equal(a.cfg.seq_len, 512);
	assert_int_equal(a.head_size, 8);
	assert_int_equal(a.kv_dim, 32);
	assert_int_equal(a.shared_classifier, 0);
	a.cfg.vocab_size = -512;
	assert_int_equal(kvtr_model_check_config(&a.cfg, "x", &bytes), 0);
	/* stories260K.bin's size (same geometry) plus a separate classifier */
	assert_int_equal(bytes, 1056540 + 512 * 64 * 4);
	n = (bytes - 28) / 4;
	assert_memory_equal(a.owned, b.owned, n * sizeof(float)); /* deterministic */
	for (uint64_t i = 0; i < n; i++)
		assert_true(isfinite(a.owned[i]));
	assert_true(a.w.wcls != a.w.tok_emb);
	kvtr_model_free(&a);
	kvtr_model_free(&b);
	assert_null(a.owned);
}

static void
test_model_file_roundtrip(void **state)
{
	struct kvtr_model a, f;
	const char *p = tmp_path("model.bin");

	(void)state;
	write_builtin_model(p, 0, 0, -1);
	assert_int_equal(kvtr_model_builtin(&a), 0);
	assert_int_equal(kvtr_model_load(p, &f), 0);
	assert_memory_equal(&a.cfg, &f.cfg, sizeof a.cfg);
	assert_int_equal(f.shared_classifier, 0);
	assert_memory_equal(a.w.w2, f.w.w2, 5 * 64 * 172 * sizeof(float));
	assert_memory_equal(a.w.rms_final, f.w.rms_final, 64 * sizeof(float));
	assert_memory_equal(a.w.wcls, f.w.wcls, 512 * 64 * sizeof(float));
	kvtr_model_free(&a);
	kvtr_model_free(&f);
}

static void
test_model_real(void **state)
{
	const char *p = rutil_model_file("stories260K.bin");
	struct kvtr_model m;

	(void)state;
	if (!p) {
		print_message("SKIPPED: ../shared/data not found\n");
		skip();
	}
	assert_int_equal(kvtr_model_load(p, &m), 0);
	assert_int_equal(m.cfg.dim, 64);
	assert_int_equal(m.cfg.n_kv_heads, 4);
	assert_int_equal(m.cfg.vocab_size, 512);
	assert_int_equal(m.shared_classifier, 1);
	kvtr_model_free(&m);
}

static void
test_bad_model_truncated(void **state)
{
	const char *p = tmp_path("short.bin");
	struct kvtr_model m;
	char want[256];
	size_t full;

	(void)state;
	full = write_builtin_model(p, 500000, 0, -1);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	snprintf(want, sizeof want, "model file %s is truncated: 500000 bytes, header implies %zu",
		 p, full);
	assert_string_equal(kvtr_last_error(), want);
	assert_null(m.map);
	/* shorter than the header itself */
	write_builtin_model(p, 10, 0, -1);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("is truncated: 10 bytes, header implies at least 28");
}

static void
test_bad_model_foreign_random(void **state)
{
	const char *p = tmp_path("random.bin");
	unsigned char buf[65536];
	uint64_t x = 0x9E3779B97F4A7C15ull;
	struct kvtr_model m;

	(void)state;
	for (size_t i = 0; i < sizeof buf; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
	rutil_write_file(p, buf, sizeof buf);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("is not a llama2.c checkpoint");
}

static void
test_bad_model_foreign_gguf(void **state)
{
	const char *p = rutil_model_file("stories260K.gguf");
	static const unsigned char hdr[32] = { 'G', 'G', 'U', 'F', 3, 0, 0, 0, 48 };
	struct kvtr_model m;

	(void)state;
	if (!p) { /* a synthetic GGUF header is enough to be refused */
		p = tmp_path("fake.gguf");
		rutil_write_file(p, hdr, sizeof hdr);
	}
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("is not a llama2.c checkpoint: it is a GGUF file (llama.cpp's "
			    "format); --model expects a llama2.c checkpoint");
}

static void
test_bad_model_heads(void **state)
{
	const char *p = tmp_path("heads.bin");
	struct kvtr_config c = { 64, 172, 5, 6, 2, 512, 512 };
	struct kvtr_model m;

	(void)state;
	rutil_write_file(p, &c, sizeof c);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("dim 64 is not divisible by n_heads 6");
	c.n_heads = 8;
	c.n_kv_heads = 3;
	rutil_write_file(p, &c, sizeof c);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("n_heads 8 is not a multiple of n_kv_heads 3");
	c.n_kv_heads = 4;
	c.seq_len = 0;
	rutil_write_file(p, &c, sizeof c);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("seq_len = 0 is outside");
}

static void
test_bad_model_trailing_and_nan(void **state)
{
	const char *p = tmp_path("odd.bin");
	struct kvtr_model m;

	(void)state;
	write_builtin_model(p, 0, 8, -1);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("is not a llama2.c checkpoint: 1187620 bytes, but the header implies "
			    "exactly 1187612");
	write_builtin_model(p, 0, 0, 1234);
	assert_int_equal(kvtr_model_load(p, &m), KVT_EFORMAT);
	assert_msg_contains("weight 1234 (byte offset 4964) is not finite");
	assert_int_equal(kvtr_model_load(tmp_path("does-not-exist.bin"), &m), -ENOENT);
	assert_msg_contains("cannot open model file");
}

/* ---- tokenizer -------------------------------------------------------------------------- */

/* Writes @t in llama2.c's tokenizer.bin format; @n tokens, the last record cut to @cut bytes
 * when cut > 0. */
static void
write_tokenizer(const char *path, const struct kvtr_tokenizer *t, int32_t n, size_t cut)
{
	FILE *f = fopen(path, "wb");
	int32_t ml = (int32_t)t->max_token_length;

	assert_non_null(f);
	fwrite(&ml, 4, 1, f);
	for (int32_t i = 0; i < n; i++) {
		int32_t len = (int32_t)strlen(t->vocab[i]);
		unsigned char rec[64];

		memcpy(rec, &t->scores[i], 4);
		memcpy(rec + 4, &len, 4);
		memcpy(rec + 8, t->vocab[i], (size_t)len);
		fwrite(rec, 1, i == n - 1 && cut ? cut : 8 + (size_t)len, f);
	}
	assert_int_equal(fclose(f), 0);
}

/* Decodes tokens[1..n) the way the runner prints them. */
static void
decode_all(const struct kvtr_tokenizer *t, const int32_t *tok, uint32_t n, char *out, size_t cap)
{
	out[0] = '\0';
	for (uint32_t i = 1; i < n; i++) {
		const char *piece = kvtr_tokenizer_decode(t, tok[i - 1], tok[i]);

		if (kvtr_piece_printable(piece))
			strncat(out, piece, cap - strlen(out) - 1);
	}
}

static void
test_tokenizer_builtin(void **state)
{
	static const char text[] = "Once upon a time, Lily saw a big dog. She was happy!";
	struct kvtr_tokenizer t;
	int32_t tok[sizeof text + 2];
	uint32_t n = 0;
	char out[256];

	(void)state;
	assert_int_equal(kvtr_tokenizer_builtin(&t), 0);
	assert_int_equal(t.vocab_size, 512);
	assert_string_equal(t.vocab[0], "<unk>");
	assert_string_equal(t.vocab[1], "\n<s>\n");
	assert_string_equal(t.vocab[2], "\n</s>\n");
	assert_string_equal(t.vocab[3], "<0x00>");
	assert_string_equal(t.vocab[258], "<0xFF>");
	assert_int_equal(kvtr_tokenizer_encode(&t, text, 1, tok, &n), 0);
	assert_int_equal(tok[0], KVTR_TOKEN_BOS);
	assert_true(n < 25); /* merges happened: far fewer tokens than bytes */
	decode_all(&t, tok, n, out, sizeof out);
	assert_string_equal(out, text);
	kvtr_tokenizer_free(&t);
}

static void
test_tokenizer_real_encode(void **state)
{
	static const int32_t want1[] = { 1, 317, 381, 261, 400, 428, 395, 392, 412, 444 };
	static const int32_t want2[] = { 1, 346, 306, 414, 432, 263, 198, 185, 420, 341, 443, 410,
					 243, 162, 155, 131 };
	static const char text2[] = "Hello, w\xc3\xb6rld! \xf0\x9f\x98\x80";
	const char *p = rutil_model_file("tok512.bin");
	struct kvtr_tokenizer t;
	int32_t tok[64];
	uint32_t n = 0;
	char out[128];

	(void)state;
	if (!p) {
		print_message("SKIPPED: ../shared/data not found\n");
		skip();
	}
	assert_int_equal(kvtr_tokenizer_load(p, 512, &t), 0);
	assert_int_equal(t.max_token_length, 7);
	/* ids printed by llama2.c run.c's encoder for the same texts */
	assert_int_equal(kvtr_tokenizer_encode(&t, "Lily had a dog named Max", 1, tok, &n), 0);
	assert_int_equal(n, sizeof want1 / sizeof want1[0]);
	assert_memory_equal(tok, want1, sizeof want1);
	assert_int_equal(kvtr_tokenizer_encode(&t, text2, 1, tok, &n), 0);
	assert_int_equal(n, sizeof want2 / sizeof want2[0]);
	assert_memory_equal(tok, want2, sizeof want2);
	decode_all(&t, tok, n, out, sizeof out);
	/* byte-fallback tokens print their raw byte only when printable (llama2.c's safe_printf,
	 * C locale): the UTF-8 bytes of the accent and the emoji are dropped */
	assert_string_equal(out, "Hello, wrld! ");
	assert_int_equal(kvtr_tokenizer_encode(&t, "", 1, tok, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(tok[0], 1);
	/* decode rules: leading space dropped only after BOS; <0xNN> is a raw byte */
	assert_string_equal(kvtr_tokenizer_decode(&t, 1, 317), "Lily");
	assert_string_equal(kvtr_tokenizer_decode(&t, 5, 317), " Lily");
	assert_string_equal(kvtr_tokenizer_decode(&t, 5, 'A' + 3), "A");
	assert_false(kvtr_piece_printable(kvtr_tokenizer_decode(&t, 5, 1 + 3)));
	assert_true(kvtr_piece_printable(kvtr_tokenizer_decode(&t, 5, '\n' + 3)));
	kvtr_tokenizer_free(&t);
}

static void
test_bad_tokenizer_truncated(void **state)
{
	const char *p = tmp_path("tok.bin");
	struct kvtr_tokenizer t, l;

	(void)state;
	assert_int_equal(kvtr_tokenizer_builtin(&t), 0);
	write_tokenizer(p, &t, 512, 0);
	assert_int_equal(kvtr_tokenizer_load(p, 512, &l), 0);
	for (int32_t i = 0; i < 512; i++)
		assert_string_equal(l.vocab[i], t.vocab[i]);
	kvtr_tokenizer_free(&l);
	write_tokenizer(p, &t, 300, 6); /* ends inside token 299 */
	assert_int_equal(kvtr_tokenizer_load(p, 512, &l), KVT_EFORMAT);
	assert_msg_contains("is truncated");
	assert_msg_contains("token 299 of 512 is cut off");
	assert_null(l.vocab);
	rutil_write_file(p, "\x07", 1);
	assert_int_equal(kvtr_tokenizer_load(p, 512, &l), KVT_EFORMAT);
	assert_msg_contains("is truncated: 1 bytes");
	kvtr_tokenizer_free(&t);
}

static void
test_bad_tokenizer_mismatch(void **state)
{
	const char *p = tmp_path("tok.bin");
	struct kvtr_tokenizer t, l;
	struct kvtr_run_opts o;
	struct kvtr_run_result r;
	struct kvtr_model m;

	(void)state;
	assert_int_equal(kvtr_tokenizer_builtin(&t), 0);
	write_tokenizer(p, &t, 512, 0);
	assert_int_equal(kvtr_tokenizer_load(p, 600, &l), KVT_EFORMAT);
	assert_msg_contains("does not match the model: it has 512 tokens, the model has 600");
	assert_int_equal(kvtr_tokenizer_load(p, 256, &l), KVT_EFORMAT);
	assert_msg_contains("does not match the model: it has 512 tokens, the model has 256");
	/* a run refuses a tokenizer of another vocabulary */
	write_tokenizer(p, &t, 300, 0);
	assert_int_equal(kvtr_tokenizer_load(p, 300, &l), 0);
	assert_int_equal(kvtr_model_builtin(&m), 0);
	kvtr_run_opts_init(&o);
	o.model = &m;
	o.tok = &l;
	assert_int_equal(kvtr_run(&o, &r), KVT_EFORMAT);
	assert_msg_contains("tokenizer does not match the model: it has 300 tokens, the model "
			    "has 512");
	kvtr_run_result_free(&r);
	kvtr_model_free(&m);
	kvtr_tokenizer_free(&l);
	kvtr_tokenizer_free(&t);
}

/* ---- sampler ---------------------------------------------------------------------------- */

static void
test_sampler_rng(void **state)
{
	uint64_t st = 42;

	(void)state;
	/* llama2.c's xorshift*, values computed independently (Python) */
	assert_int_equal(kvtr_random_u32(&st), 1456360119u);
	assert_int_equal(kvtr_random_u32(&st), 3359763283u);
	assert_int_equal(kvtr_random_u32(&st), 3393612768u);
	assert_int_equal(st, UINT64_C(142435135655313518));
	st = 42;
	assert_true(kvtr_random_f32(&st) == (float)(1456360119u >> 8) / 16777216.0f);
}

static void
test_sampler_rules(void **state)
{
	struct kvtr_sampler s;
	float logits[5] = { 0.5f, 3.0f, 3.0f, -1.0f, 0.0f };
	float peaked[5] = { 0.0f, 0.0f, 20.0f, 0.0f, 0.0f };
	uint64_t st0;

	(void)state;
	assert_int_equal(kvtr_sampler_init(&s, 5, 0.0f, 0.9f, 7), 0);
	assert_int_equal(kvtr_sampler_sample(&s, logits), 1); /* first maximum wins */
	assert_int_equal(s.rng_state, 7);                      /* greedy draws no random number */
	kvtr_sampler_fini(&s);
	assert_int_equal(kvtr_sampler_init(&s, 5, 1.0f, 0.9f, 7), 0);
	st0 = s.rng_state;
	assert_int_equal(kvtr_sampler_sample(&s, peaked), 2); /* top-p keeps only the peak */
	assert_true(s.rng_state != st0);
	assert_true(fabsf(peaked[2] - 1.0f) < 1e-6f);          /* logits became probabilities */
	kvtr_sampler_fini(&s);
	assert_int_equal(kvtr_sampler_init(&s, 5, 1.0f, 0.0f, 0), -EINVAL); /* seed 0 */
}

static void
test_sampler_deterministic(void **state)
{
	struct kvtr_sampler a, b;
	int32_t hist[8] = { 0 };

	(void)state;
	assert_int_equal(kvtr_sampler_init(&a, 8, 1.0f, 1.0f, 1234), 0);
	assert_int_equal(kvtr_sampler_init(&b, 8, 1.0f, 1.0f, 1234), 0);
	for (int i = 0; i < 400; i++) {
		float la[8], lb[8];
		int32_t x, y;

		for (int j = 0; j < 8; j++)
			la[j] = lb[j] = (float)j * 0.25f;
		x = kvtr_sampler_sample(&a, la);
		y = kvtr_sampler_sample(&b, lb);
		assert_int_equal(x, y);
		assert_true(x >= 0 && x < 8);
		hist[x]++;
	}
	assert_true(hist[7] > hist[0]); /* plain sampling follows the distribution */
	assert_true(hist[0] > 0);
	kvtr_sampler_fini(&a);
	kvtr_sampler_fini(&b);
}

/* ---- forward ---------------------------------------------------------------------------- */

static void
test_forward_real_first_token(void **state)
{
	const char *p = rutil_model_file("stories260K.bin");
	struct kvtr_model m;
	struct kvtr_state s;
	struct kvtr_kvcache c = { 0 };
	struct kvtr_sampler g;

	(void)state;
	if (!p) {
		print_message("SKIPPED: ../shared/data not found\n");
		skip();
	}
	assert_int_equal(kvtr_model_load(p, &m), 0);
	assert_int_equal(kvtr_state_init(&s, &m), 0);
	assert_int_equal(kvtr_kvcache_init(&c, &m), 0);
	assert_int_equal(kvtr_sampler_init(&g, 512, 0.0f, 0.9f, 1), 0);
	kvtr_forward_contig(&m, &s, &c, 1, 0);
	assert_int_equal(kvtr_sampler_sample(&g, s.logits), 403); /* " Once", as llama2.c */
	kvtr_forward_contig(&m, &s, &c, 403, 1);
	assert_int_equal(kvtr_sampler_sample(&g, s.logits), 407); /* " upon" */
	kvtr_sampler_fini(&g);
	kvtr_kvcache_fini(&c);
	kvtr_state_fini(&s);
	kvtr_model_free(&m);
}

static void
run_builtin_dt(struct kvtr_run_result *r, int reference, uint32_t hbm_blocks, uint32_t sessions,
	       uint32_t turns, float temperature, enum kvt_dtype dt)
{
	/* 8 tokens x 5 layers x (K + V) x 32 values */
	uint64_t block = 8 * 5 * 2 * 32 * kvt_dtype_size(dt);
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	struct kvtr_run_opts o;
	int rc;

	assert_int_equal(kvtr_model_builtin(&m), 0);
	assert_int_equal(kvtr_tokenizer_builtin(&t), 0);
	kvtr_run_opts_init(&o);
	o.model = &m;
	o.tok = &t;
	o.steps = 90;
	o.temperature = temperature;
	o.seed = 99;
	o.sessions = sessions;
	o.turns = turns;
	o.reference = reference;
	o.tokens_per_block = 8;
	o.kv_dtype = dt;
	o.hbm_bytes = hbm_blocks * block;
	o.host_bytes = hbm_blocks ? 4 * block : 0;
	o.nvme_dir = tmp_dir;
	o.emu_delay_us = 20;
	rc = kvtr_run(&o, r);
	if (rc)
		fail_msg("kvtr_run: %s", kvtr_last_error());
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
}

static void
run_builtin(struct kvtr_run_result *r, int reference, uint32_t hbm_blocks, uint32_t sessions,
	    uint32_t turns, float temperature)
{
	run_builtin_dt(r, reference, hbm_blocks, sessions, turns, temperature, KVT_DTYPE_F32);
}

static void
assert_same_tokens(const struct kvtr_run_result *a, const struct kvtr_run_result *b)
{
	assert_int_equal(a->sessions, b->sessions);
	assert_int_equal(a->turns, b->turns);
	for (size_t i = 0; i < (size_t)a->sessions * a->turns; i++) {
		assert_int_equal(a->out[i].n_tokens, b->out[i].n_tokens);
		assert_memory_equal(a->out[i].tokens, b->out[i].tokens,
				    a->out[i].n_tokens * sizeof(int32_t));
		assert_string_equal(a->out[i].text, b->out[i].text);
	}
}

/* The built-in model decodes identically through kvtier (paged, windows, NVMe) and through
 * the contiguous reference: no shared data needed. */
static void
test_forward_paged_equals_contiguous(void **state)
{
	struct kvtr_run_result ref, all, tiny;

	(void)state;
	run_builtin(&ref, 1, 0, 1, 1, 0.8f);
	run_builtin(&all, 0, 0, 1, 1, 0.8f);
	run_builtin(&tiny, 0, 4, 1, 1, 0.8f); /* 12 blocks through 4 HBM slots: windows */
	assert_true(ref.out[0].n_tokens > 20);
	assert_same_tokens(&ref, &all);
	assert_same_tokens(&ref, &tiny);
	assert_true(tiny.windowed_positions > 0);
	assert_true(tiny.stats.blocks_moved[KVT_MOVE_NVME_TO_HOST] > 0);
	assert_true(tiny.stats.checksum_verified > 0);
	assert_int_equal(tiny.stats.checksum_failed, 0);
	kvtr_run_result_free(&ref);
	kvtr_run_result_free(&all);
	kvtr_run_result_free(&tiny);
}

static void
test_sessions_turns_builtin(void **state)
{
	struct kvtr_run_result ref, kvt;

	(void)state;
	run_builtin(&ref, 1, 0, 3, 2, 1.0f);
	run_builtin(&kvt, 0, 6, 3, 2, 1.0f);
	assert_same_tokens(&ref, &kvt);
	assert_int_equal(kvt.parks, 6); /* every session parked after every turn */
	assert_true(kvt.stats.blocks_moved[KVT_MOVE_HOST_TO_NVME] > 0);
	kvtr_run_result_free(&ref);
	kvtr_run_result_free(&kvt);
}

/* --reference --kv-dtype bf16/f16 rounds its contiguous K/V as kvtier stores them: the same
 * tokens as kvtier with that dtype (windows and NVMe included), sampled, 1 session x 2 turns. */
static void
test_reference_kv_dtype(void **state)
{
	static const enum kvt_dtype dts[] = { KVT_DTYPE_BF16, KVT_DTYPE_F16 };
	struct kvtr_run_result f32, ref, kvt;

	(void)state;
	run_builtin_dt(&f32, 1, 0, 1, 2, 1.0f, KVT_DTYPE_F32);
	for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
		run_builtin_dt(&ref, 1, 0, 1, 2, 1.0f, dts[i]);
		run_builtin_dt(&kvt, 0, 8, 1, 2, 1.0f, dts[i]);
		assert_same_tokens(&ref, &kvt);
		assert_true(kvt.windowed_positions > 0);
		assert_true(kvt.stats.blocks_moved[KVT_MOVE_NVME_TO_HOST] > 0);
		kvtr_run_result_free(&ref);
		kvtr_run_result_free(&kvt);
	}
	/* the rounding matters for this run: bf16 changes the sampled tokens */
	run_builtin_dt(&ref, 1, 0, 1, 2, 1.0f, KVT_DTYPE_BF16);
	assert_true(rutil_tokens_differ(&f32, &ref));
	kvtr_run_result_free(&ref);
	kvtr_run_result_free(&f32);
}

/* The contiguous cache with dtype BF16 holds the values rounded exactly as a bf16 block. */
static void
test_kvcache_dtype_rounding(void **state)
{
	struct kvtr_model m;
	struct kvtr_state s;
	struct kvtr_kvcache c;
	uint16_t h[32];
	float want[32];

	(void)state;
	assert_int_equal(kvtr_model_builtin(&m), 0);
	assert_int_equal(kvtr_state_init(&s, &m), 0);
	assert_int_equal(kvtr_kvcache_init(&c, &m), 0);
	assert_int_equal(c.dtype, KVT_DTYPE_F32);
	c.dtype = KVT_DTYPE_BF16;
	kvtr_forward_contig(&m, &s, &c, 1, 0);
	kvtr_forward_contig(&m, &s, &c, 300, 1);
	/* layer 4, position 1: the last K/V computed, still in s.k / s.v */
	assert_int_equal(kvt_store_f32(KVT_DTYPE_BF16, h, s.k, 32), 0);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_BF16, want, h, 32), 0);
	assert_memory_equal(c.k + (4 * 512 + 1) * 32, want, sizeof want);
	assert_true(memcmp(want, s.k, sizeof want) != 0); /* bf16 did round something */
	assert_int_equal(kvt_store_f32(KVT_DTYPE_BF16, h, s.v, 32), 0);
	assert_int_equal(kvt_load_f32(KVT_DTYPE_BF16, want, h, 32), 0);
	assert_memory_equal(c.v + (4 * 512 + 1) * 32, want, sizeof want);
	kvtr_kvcache_fini(&c);
	kvtr_state_fini(&s);
	kvtr_model_free(&m);
}

/* A prompt longer than --steps is cut with one warning line saying what was kept/dropped. */
static void
test_prompt_cut_warning(void **state)
{
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	struct kvtr_run_opts o;
	struct kvtr_run_result r;
	int32_t tok[64];
	uint32_t n = 0;
	char want[256], *log;
	FILE *f;

	(void)state;
	assert_int_equal(kvtr_model_builtin(&m), 0);
	assert_int_equal(kvtr_tokenizer_builtin(&t), 0);
	kvtr_run_opts_init(&o);
	o.model = &m;
	o.tok = &t;
	o.prompt = "Once upon a time, Lily saw a big dog. She was happy!";
	assert_int_equal(kvtr_tokenizer_encode(&t, o.prompt, 1, tok, &n), 0);
	assert_true(n - 1 > 5);
	o.steps = 5;
	o.turns = 2;
	o.temperature = 0.0f;
	o.nvme_dir = tmp_dir;
	f = fopen(tmp_path("log.txt"), "w");
	assert_non_null(f);
	o.log = f;
	assert_int_equal(kvtr_run(&o, &r), 0);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(r.out[0].n_tokens, 5); /* only prompt tokens, no room to generate */
	log = rutil_read_file(tmp_path("log.txt"), NULL);
	snprintf(want, sizeof want, "kvtier-run: warning: session 1 turn 1: the prompt is %u "
		 "tokens but the turn has room for 5 (steps 5, 512 positions left of the model's "
		 "context 512): 5 kept, %u dropped\n", n - 1, n - 6);
	if (!strstr(log, want))
		fail_msg("log \"%s\" lacks \"%s\"", log, want);
	assert_non_null(strstr(log, "session 1 turn 2: the prompt is"));
	kvtr_run_result_free(&r);
	free(log);
	/* a prompt that fits: no warning */
	o.steps = 0;
	o.turns = 1;
	f = fopen(tmp_path("log.txt"), "w");
	assert_non_null(f);
	o.log = f;
	assert_int_equal(kvtr_run(&o, &r), 0);
	assert_int_equal(fclose(f), 0);
	log = rutil_read_file(tmp_path("log.txt"), NULL);
	assert_null(strstr(log, "warning"));
	free(log);
	kvtr_run_result_free(&r);
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
}

/* ---- bad inputs of a run ---------------------------------------------------------------- */

static int
run_opts_bad(uint64_t hbm, uint64_t host, const char *nvme_dir, uint32_t steps)
{
	struct kvtr_model m;
	struct kvtr_tokenizer t;
	struct kvtr_run_opts o;
	struct kvtr_run_result r;
	int rc;

	assert_int_equal(kvtr_model_builtin(&m), 0);
	assert_int_equal(kvtr_tokenizer_builtin(&t), 0);
	kvtr_run_opts_init(&o);
	o.model = &m;
	o.tok = &t;
	o.steps = steps;
	o.temperature = 0.0f;
	o.hbm_bytes = hbm;
	o.host_bytes = host;
	o.nvme_dir = nvme_dir;
	o.log = stdout;
	rc = kvtr_run(&o, &r);
	kvtr_run_result_free(&r);
	kvtr_tokenizer_free(&t);
	kvtr_model_free(&m);
	return rc;
}

/* Occurrences of @needle in @hay. */
static int
count_substr(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

static void
test_bad_nvme_dir_missing(void **state)
{
	(void)state;
	assert_int_equal(run_opts_bad(0, 0, tmp_path("missing/sub"), 10), -ENOENT);
	assert_msg_contains("kvt_engine_create: ");
	assert_msg_contains("missing/sub");
	/* the library's message names the error; the runner does not repeat it */
	if (count_substr(kvtr_last_error(), kvt_strerror(-ENOENT)) != 1)
		fail_msg("\"%s\" names \"%s\" more than once", kvtr_last_error(),
			 kvt_strerror(-ENOENT));
}

static void
test_bad_nvme_dir_not_a_dir(void **state)
{
	(void)state;
	rutil_write_file(tmp_path("file"), "x", 1);
	assert_int_equal(run_opts_bad(0, 0, tmp_path("file/sub"), 10), -ENOTDIR);
	assert_msg_contains("file/sub");
	assert_true(count_substr(kvtr_last_error(), kvt_strerror(-ENOTDIR)) <= 1);
}

static void
test_bad_hbm_below_one_block(void **state)
{
	(void)state;
	/* a block is 16 tokens x 1280 bytes = 20 KiB */
	assert_int_equal(run_opts_bad(1000, 0, tmp_dir, 10), -EINVAL);
	assert_msg_contains("kvt_engine_create");
	assert_int_equal(run_opts_bad(0, 1000, tmp_dir, 10), -EINVAL);
	assert_msg_contains("kvt_engine_create");
}

static void
test_bad_hbm_one_block_batch(void **state)
{
	(void)state;
	/* one HBM slot holds a 16-token sequence, not a 40-token one */
	assert_int_equal(run_opts_bad(20480, 40960, tmp_dir, 16), 0);
	assert_int_equal(run_opts_bad(20480, 40960, tmp_dir, 40), KVT_ETOOBIG);
	assert_msg_contains("too small to hold one decode batch");
}

static void
test_bad_seq_after_close(void **state)
{
	struct tsup_cfg cfg = { .hbm_blocks = 8 };
	struct kvt_engine *e;
	kvt_seq_id s, s2;
	int64_t slot;
	int32_t tok = 5;
	char *dir;

	(void)state;
	e = tsup_engine(&cfg, &dir);
	assert_int_equal(kvt_seq_open(e, NULL, &s), 0);
	assert_int_equal(kvt_seq_append(e, s, &tok, 1, &slot), 0);
	assert_int_equal(kvt_seq_close(e, s), 0);
	assert_int_equal(kvt_seq_append(e, s, &tok, 1, &slot), KVT_ECLOSED);
	assert_true(kvt_last_error_message()[0] != '\0');
	assert_int_equal(kvt_seq_close(e, s), KVT_ECLOSED);
	/* the engine is still usable */
	assert_int_equal(kvt_seq_open(e, NULL, &s2), 0);
	assert_true(s2 != s);
	assert_int_equal(tsup_append_write(e, s2, 3, 0, 9), 0);
	assert_int_equal(tsup_verify(e, s2, 3), 0);
	assert_int_equal(kvt_seq_close(e, s2), 0);
	kvt_engine_destroy(e);
	tsup_rmdir(dir);
}

static void
test_bad_sizes_cli(void **state)
{
	static const char *const cases[][2] = {
		{ "--hbm 0", "kvtier-run: --hbm: size must be greater than zero" },
		{ "--host 2000000G", "kvtier-run: --host: size '2000000G' is out of range" },
		{ "--steps 99999999999999999999", "--steps: 99999999999999999999 is out of range" },
		{ "--nvme 12Q", "kvtier-run: --nvme: '12Q' has an unknown suffix" },
		{ "--hbm -4K", "kvtier-run: --hbm: '-4K' is not a size" },
		{ "--steps", "kvtier-run: option --steps needs a value (see --help)" },
		{ "--bogus", "kvtier-run: unknown option --bogus (see --help)" },
		{ "--bogus=3", "kvtier-run: unknown option --bogus (see --help)" },
		{ "-x 5", "kvtier-run: unknown option -x (see --help)" },
		{ "-n 5", "kvtier-run: unknown option -n (see --help)" },
		{ "-t 0", "kvtier-run: unknown option -t (see --help)" },
		{ "--reference=1", "kvtier-run: option --reference takes no value" },
		{ "--t 1", "kvtier-run: ambiguous option --t" },
		{ "--model m.bin", "kvtier-run: --model needs --tokenizer (the built-in tokenizer "
				   "only fits the built-in model)" },
	};
	char *out, *err;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		assert_int_equal(rutil_run(tmp_dir, cases[i][0], &out, &err), 2);
		if (!strstr(err, cases[i][1]))
			fail_msg("'%s': stderr \"%s\" lacks \"%s\"", cases[i][0], err, cases[i][1]);
		assert_string_equal(out, "");
		free(out);
		free(err);
	}
}

static void
test_bad_model_cli(void **state)
{
	char args[1200], *out, *err;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	rutil_write_file(tmp_path("junk.bin"), "GGUF\3\0\0\0 this is not a model at all", 36);
	rutil_write_file(tmp_path("tok.bin"), "\x07", 1);
	snprintf(args, sizeof args, "--model '%s' --tokenizer '%s' --steps 5", tmp_path("junk.bin"),
		 tmp_path("tok.bin"));
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 1);
	assert_non_null(strstr(err, "kvtier-run: "));
	assert_non_null(strstr(err, "is not a llama2.c checkpoint: it is a GGUF file"));
	free(out);
	free(err);
	snprintf(args, sizeof args, "--steps 30 --hbm 20K --tokens-per-block 16 --nvme-dir '%s'",
		 tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 1);
	assert_non_null(strstr(err, "kvtier-run: HBM holds 1 block slot(s): too small"));
	/* refused before the run, with the minimum: nothing printed */
	assert_non_null(strstr(err, "use --hbm 40960 or more (2 blocks of 20480 bytes) with "
				    "--tokens-per-block 16"));
	assert_string_equal(out, "");
	free(out);
	free(err);
	/* the minimum works, through windows */
	snprintf(args, sizeof args, "--steps 30 --hbm 40960 --tokens-per-block 16 --nvme-dir '%s'",
		 tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	assert_true(strlen(out) > 10);
	free(out);
	free(err);
}

/* A valid model file without --tokenizer is refused: the built-in tokenizer would print
 * gibberish for it. */
static void
test_model_needs_tokenizer_cli(void **state)
{
	char args[1200], *out, *err;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	write_builtin_model(tmp_path("model.bin"), 0, 0, -1);
	snprintf(args, sizeof args, "--model '%s' --steps 5 --nvme-dir '%s'",
		 tmp_path("model.bin"), tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 2);
	assert_string_equal(err, "kvtier-run: --model needs --tokenizer (the built-in tokenizer "
			    "only fits the built-in model)\n");
	assert_string_equal(out, "");
	free(out);
	free(err);
}

/* -h is --help; the help states the defaults and what the built-in text depends on; without
 * --model and --seed the text is that of --seed 1 (not the clock). */
static void
test_help_and_builtin_seed_cli(void **state)
{
	static const char *const help[] = {
		"-h, --help", "(default 256;", "(default 1.0)", "(default 0.9)",
		"(default: the clock with --model, 1 without; 0 = clock)",
		"concurrent chat sessions (default 1)",
		"                        (default 1)\n  --hbm", "seed is then 1, not the clock",
		"written\n                        only when it succeeds",
		"Exit status: 0 done; 2 usage error",
		"--nvme-dir is 1 MiB (superblock area) + the slots, so\n"
		"                        up to 1 MiB more than SIZE",
		"random weights: the\ntext is gibberish",
	};
	char args[1200], *out, *out1, *out2, *err;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	assert_int_equal(rutil_run(tmp_dir, "-h", &out, &err), 0);
	for (size_t i = 0; i < sizeof help / sizeof help[0]; i++)
		if (!strstr(out, help[i]))
			fail_msg("--help lacks \"%s\":\n%s", help[i], out);
	assert_string_equal(err, "");
	free(out);
	free(err);
	snprintf(args, sizeof args, "--steps 40 --nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	free(err);
	snprintf(args, sizeof args, "--steps 40 --seed 1 --nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out1, &err), 0);
	free(err);
	snprintf(args, sizeof args, "--steps 40 --seed 2 --nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out2, &err), 0);
	free(err);
	assert_string_equal(out, out1);
	assert_string_not_equal(out1, out2); /* the seed does matter at temperature 1 */
	free(out);
	free(out1);
	free(out2);
}

/* kvtr_summary_write: the exact line from the stats, the built-in model's note, --reference. */
static void
test_summary_line(void **state)
{
	struct kvtr_run_result r;
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	(void)state;
	memset(&r, 0, sizeof r);
	r.stats.tier[KVT_TIER_HBM].used_slots = 3;
	r.stats.tier[KVT_TIER_HBM].slots = 4;
	r.stats.tier[KVT_TIER_HBM].used_bytes = 3 * 10240;
	r.stats.tier[KVT_TIER_HOST].slots = 2;
	r.stats.tier[KVT_TIER_NVME].used_slots = 5;
	r.stats.tier[KVT_TIER_NVME].slots = 100;
	r.stats.tier[KVT_TIER_NVME].used_bytes = 5ull << 20;
	r.stats.blocks_moved[KVT_MOVE_HBM_TO_HOST] = 7;
	r.stats.blocks_moved[KVT_MOVE_HOST_TO_NVME] = 6;
	r.stats.blocks_moved[KVT_MOVE_NVME_TO_HOST] = 2;
	r.stats.blocks_moved[KVT_MOVE_HOST_TO_HBM] = 9;
	r.stats.checksum_verified = 2;
	f = open_memstream(&buf, &len);
	assert_non_null(f);
	assert_int_equal(kvtr_summary_write(f, &r, 1), 0);
	r.reference = 1;
	assert_int_equal(kvtr_summary_write(f, &r, 0), 0);
	assert_int_equal(fclose(f), 0);
	assert_string_equal(buf,
		"kvtier: tiers used hbm 3/4 blocks (30.0 KiB), host 0/2 blocks (0 B), "
		"nvme 5/100 blocks (5.0 MiB); blocks moved hbm_to_host 7, host_to_nvme 6, "
		"nvme_to_host 2, host_to_hbm 9; NVMe checksums verified 2, failed 0\n"
		"(built-in model: random weights, the text is meaningless; --model for a real "
		"one)\n"
		"kvtier: reference run (contiguous KV cache, no kvtier)\n");
	free(buf);
}

/* --stats-json carries the engine's codec counters, idle parks, batches and repromotions. */
static void
test_stats_json_engine_counters(void **state)
{
	struct kvtr_run_result r;
	struct kvtr_run_opts o;
	const cJSON *codec;
	char *buf = NULL;
	size_t len = 0;
	cJSON *root;
	FILE *f;

	(void)state;
	memset(&r, 0, sizeof r);
	kvtr_run_opts_init(&o);
	r.stats.codec_blocks = 3;
	r.stats.codec_raw_bytes = 30000;
	r.stats.codec_stored_bytes = 12000;
	r.stats.idle_parked = 4;
	r.stats.batches = 5;
	r.stats.repromotions = 6;
	f = open_memstream(&buf, &len);
	assert_non_null(f);
	assert_int_equal(kvtr_stats_json_write(f, "mem", &o, &r), 0);
	assert_int_equal(fclose(f), 0);
	root = cJSON_Parse(buf);
	assert_non_null(root);
	codec = cJSON_GetObjectItemCaseSensitive(root, "codec");
	assert_true(cJSON_IsObject(codec));
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(codec, "blocks")) == 3);
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(codec, "raw_bytes")) ==
		    30000);
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(codec,
									  "stored_bytes")) == 12000);
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root, "idle_parked")) ==
		    4);
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root,
									  "engine_batches")) == 5);
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root,
									  "repromotions")) == 6);
	cJSON_Delete(root);
	free(buf);
}

/* The CLI prints the summary on stderr (stdout stays the text): with the built-in model the
 * note about its random weights; the blocks it moved through NVMe and their checksums. */
static void
test_summary_cli(void **state)
{
	char args[1200], *out, *err;
	const char *model = rutil_model_file("stories260K.bin");
	const char *tok = rutil_model_file("tok512.bin");

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	snprintf(args, sizeof args, "--steps 40 --tokens-per-block 8 --hbm 40K --host 20K "
		 "--nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	assert_null(strstr(out, "kvtier:"));
	assert_null(strstr(out, "built-in model"));
	assert_non_null(strstr(err, "kvtier: tiers used hbm "));
	assert_non_null(strstr(err, "/4 blocks ("));
	assert_non_null(strstr(err, "; blocks moved hbm_to_host "));
	assert_null(strstr(err, "host_to_nvme 0,"));
	assert_null(strstr(err, "nvme_to_host 0,"));
	assert_non_null(strstr(err, "; NVMe checksums verified "));
	assert_null(strstr(err, "verified 0,"));
	assert_non_null(strstr(err, "failed 0\n(built-in model: random weights, the text is "
			       "meaningless; --model for a real one)\n"));
	free(out);
	free(err);
	if (!model || !tok)
		return;
	snprintf(args, sizeof args, "--model '%s' --tokenizer '%s' --steps 20 --nvme-dir '%s'",
		 model, tok, tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	assert_non_null(strstr(err, "kvtier: tiers used hbm "));
	assert_null(strstr(err, "built-in model"));
	free(out);
	free(err);
}

/*
 * Without --nvme the NVMe tier has room for every block of every session at the model's full
 * length: 2 sessions x 512 / 8 = 128 slots of 4 KiB + 12 KiB (a header page, then the 10 KiB
 * block rounded up), read off the summary line. The default once forgot the header page and
 * gave 96 slots, so full-length sessions could not all be parked.
 */
static void
test_default_nvme_room_cli(void **state)
{
	char args[1200], *out, *err;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	snprintf(args, sizeof args, "--sessions 2 --steps 8 --tokens-per-block 8 --hbm 40K "
		 "--host 20K --nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	assert_non_null(strstr(err, "/128 blocks ("));
	free(out);
	free(err);
}

/* --stats-json to a path that cannot be written fails before decoding anything. */
static void
test_stats_json_unwritable_cli(void **state)
{
	char args[1200], *out, *err;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	snprintf(args, sizeof args, "--steps 40 --nvme-dir '%s' --stats-json '%s'", tmp_dir,
		 tmp_path("no-such-dir/stats.json"));
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 2);
	assert_string_equal(out, "");
	assert_non_null(strstr(err, "kvtier-run: --stats-json: cannot write "));
	assert_non_null(strstr(err, "no-such-dir/stats.json: No such file or directory"));
	assert_null(strstr(err, "achieved tok/s"));
	free(out);
	free(err);
	/* a run that fails after opening it leaves no stats file behind */
	snprintf(args, sizeof args, "--steps 40 --hbm 20K --nvme-dir '%s' --stats-json '%s'",
		 tmp_dir, tmp_path("stats.json"));
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 1);
	assert_int_equal(access(tmp_path("stats.json"), F_OK), -1);
	free(out);
	free(err);
}

/* After a failed run the --stats-json and --metrics files that existed are left as they were
 * (not emptied); an unwritable --metrics fails before decoding (exit 2), as --stats-json does. */
static void
test_outputs_written_on_success_cli(void **state)
{
	char args[1200], *out, *err, *got;
	size_t len;

	(void)state;
	if (!rutil_run_binary()) {
		print_message("SKIPPED: kvtier-run binary not found\n");
		skip();
	}
	rutil_write_file(tmp_path("old.json"), "old\n", 4);
	rutil_write_file(tmp_path("old.prom"), "old\n", 4);
	snprintf(args, sizeof args, "--steps 40 --hbm 20K --nvme-dir '%s' --stats-json '%s' "
		 "--metrics '%s'", tmp_dir, tmp_path("old.json"), tmp_path("old.prom"));
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 1);
	free(out);
	free(err);
	got = rutil_read_file(tmp_path("old.json"), &len);
	assert_int_equal(len, 4);
	assert_memory_equal(got, "old\n", 4);
	free(got);
	got = rutil_read_file(tmp_path("old.prom"), &len);
	assert_int_equal(len, 4);
	free(got);
	snprintf(args, sizeof args, "--steps 40 --nvme-dir '%s' --stats-json '%s' --metrics '%s'",
		 tmp_dir, tmp_path("old.json"), tmp_path("no-such-dir/m.prom"));
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 2);
	assert_string_equal(out, "");
	assert_non_null(strstr(err, "kvtier-run: --metrics: cannot write "));
	assert_non_null(strstr(err, "no-such-dir/m.prom: No such file or directory"));
	assert_null(strstr(err, "achieved tok/s"));
	free(out);
	free(err);
	got = rutil_read_file(tmp_path("old.json"), &len);
	assert_int_equal(len, 4);
	free(got);
	/* a run that succeeds replaces both files */
	snprintf(args, sizeof args, "--steps 40 --nvme-dir '%s' --stats-json '%s' --metrics '%s'",
		 tmp_dir, tmp_path("old.json"), tmp_path("old.prom"));
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	free(out);
	free(err);
	got = rutil_read_file(tmp_path("old.json"), &len);
	assert_true(len > 4 && got[0] == '{' && got[len - 1] == '\n');
	free(got);
	got = rutil_read_file(tmp_path("old.prom"), &len);
	assert_true(len > 4 && strncmp(got, "# HELP kvtier_", 14) == 0);
	free(got);
	/* outputs that are no regular file (nothing to empty) work as before */
	snprintf(args, sizeof args, "--steps 40 --nvme-dir '%s' --stats-json /dev/null "
		 "--metrics /dev/null", tmp_dir);
	assert_int_equal(rutil_run(tmp_dir, args, &out, &err), 0);
	assert_null(strstr(err, "cannot write"));
	free(out);
	free(err);
}

/* Text that cannot be written to stdout fails the run, streamed or printed per turn. */
static void
test_stdout_full_cli(void **state)
{
	char args[1200], *err;

	(void)state;
	if (!rutil_run_binary() || access("/dev/full", W_OK) != 0) {
		print_message("SKIPPED: kvtier-run binary or /dev/full not found\n");
		skip();
	}
	snprintf(args, sizeof args, "--steps 40 --nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run_stdout_to(tmp_dir, args, "/dev/full", &err), 1);
	assert_non_null(strstr(err, "kvtier-run: cannot write the generated text: No space left "
				    "on device"));
	free(err);
	snprintf(args, sizeof args, "--steps 40 --sessions 2 --nvme-dir '%s'", tmp_dir);
	assert_int_equal(rutil_run_stdout_to(tmp_dir, args, "/dev/full", &err), 1);
	assert_non_null(strstr(err, "kvtier-run: cannot write the text to stdout: No space left "
				    "on device"));
	free(err);
	assert_int_equal(rutil_run_stdout_to(tmp_dir, "--help", "/dev/full", &err), 1);
	assert_non_null(strstr(err, "cannot write the text to stdout"));
	free(err);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size_ok),
		cmocka_unit_test(test_parse_size_bad),
		cmocka_unit_test(test_parse_numbers),
		cmocka_unit_test(test_builtin_model),
		cmocka_unit_test_setup_teardown(test_model_file_roundtrip, setup, teardown),
		cmocka_unit_test(test_model_real),
		cmocka_unit_test_setup_teardown(test_bad_model_truncated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_model_foreign_random, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_model_foreign_gguf, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_model_heads, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_model_trailing_and_nan, setup, teardown),
		cmocka_unit_test(test_tokenizer_builtin),
		cmocka_unit_test(test_tokenizer_real_encode),
		cmocka_unit_test_setup_teardown(test_bad_tokenizer_truncated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_tokenizer_mismatch, setup, teardown),
		cmocka_unit_test(test_sampler_rng),
		cmocka_unit_test(test_sampler_rules),
		cmocka_unit_test(test_sampler_deterministic),
		cmocka_unit_test(test_forward_real_first_token),
		cmocka_unit_test_setup_teardown(test_forward_paged_equals_contiguous, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_sessions_turns_builtin, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_nvme_dir_missing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_nvme_dir_not_a_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_hbm_below_one_block, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_hbm_one_block_batch, setup, teardown),
		cmocka_unit_test(test_bad_seq_after_close),
		cmocka_unit_test_setup_teardown(test_bad_sizes_cli, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_model_cli, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reference_kv_dtype, setup, teardown),
		cmocka_unit_test(test_kvcache_dtype_rounding),
		cmocka_unit_test_setup_teardown(test_prompt_cut_warning, setup, teardown),
		cmocka_unit_test_setup_teardown(test_model_needs_tokenizer_cli, setup, teardown),
		cmocka_unit_test_setup_teardown(test_help_and_builtin_seed_cli, setup, teardown),
		cmocka_unit_test(test_summary_line),
		cmocka_unit_test(test_stats_json_engine_counters),
		cmocka_unit_test_setup_teardown(test_summary_cli, setup, teardown),
		cmocka_unit_test_setup_teardown(test_default_nvme_room_cli, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stats_json_unwritable_cli, setup, teardown),
		cmocka_unit_test_setup_teardown(test_outputs_written_on_success_cli, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_stdout_full_cli, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
