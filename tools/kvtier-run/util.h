/* SPDX-License-Identifier: MIT */
/*
 * tools/kvtier-run/util.h - small helpers shared by kvtier-run's modules: the tool's own
 * last-error message (kvtr_err, like the library's kvt_err), parsers for the command-line
 * values (sizes with K/M/G suffixes, bounded integers, floats), a clock and a growable string.
 *
 * Error convention of the whole tool library (kvtrun): functions return 0 or a negative code
 * (-errno or a KVT_E* code from kvtier.h) and leave a one-line explanation in
 * kvtr_last_error() for the calling thread; main() prints it as "kvtier-run: <message>".
 */
#ifndef KVTR_UTIL_H
#define KVTR_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#if defined(__GNUC__)
#define KVTR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KVTR_PRINTF(a, b)
#endif

/** Largest size kvtr_parse_size() accepts: 1 PiB, the largest tier kvt_engine_create()
 * accepts (engine.c), so a size the runner takes is never refused for its magnitude. */
#define KVTR_SIZE_MAX (UINT64_C(1) << 50)

/**
 * kvtr_err() - record "message" (printf format) as the calling thread's last error and return
 * @code unchanged, so failures read `return kvtr_err(KVT_EFORMAT, "...", ...);`.
 */
int kvtr_err(int code, const char *fmt, ...) KVTR_PRINTF(2, 3);

/**
 * kvtr_err_kvt() - record the failure of a kvtier call: "<what>: <the library's
 * kvt_last_error_message()>" (which names the error itself; repeats of the name inside a nested
 * message are dropped), or "<what>: <kvt_strerror(code)>" when the library left no message;
 * returns @code. Call it right after the failing call,
 * before any other kvtier call replaces the library's message.
 */
int kvtr_err_kvt(int code, const char *what);

/** kvtr_last_error() - the calling thread's last message ("" if none). Thread-local. */
const char *kvtr_last_error(void);

/** kvtr_now_ns() - CLOCK_MONOTONIC in nanoseconds: the one clock of the tools' timings. */
uint64_t kvtr_now_ns(void);

/** kvtr_now() - kvtr_now_ns() in seconds. */
double kvtr_now(void);

/**
 * kvtr_parse_bytes() - parse a byte count, the one size syntax of the tools: decimal digits, an
 * optional fraction (".5") and an optional binary suffix K, M, G, T or P (powers of 1024, either
 * case, optionally followed by "iB" or "B"; "B" alone is bytes): "4096", "64M", "1.5G", "4TiB".
 * Rejects empty strings, signs, spaces, unknown suffixes, fractions of a byte, values below
 * @min and above @max, each with a message naming @what (e.g. "--hbm").
 * Returns 0 and *out, or -EINVAL (*out untouched).
 */
int kvtr_parse_bytes(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out);

/**
 * kvtr_parse_size() - kvtr_parse_bytes() of a tier size: at least 1 byte, at most KVTR_SIZE_MAX
 * ("out of range (more than 1 PiB ...)"); 0 is "size must be greater than zero".
 * Returns 0 and *out, or -EINVAL.
 */
int kvtr_parse_size(const char *what, const char *s, uint64_t *out);

/**
 * kvtr_parse_u64() - parse a decimal integer in [min, max] (no sign, no suffix); digits
 * beyond UINT64_MAX are "out of range" like any value above @max.
 * Returns 0 and *out, or -EINVAL with a message naming @what.
 */
int kvtr_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out);

/** kvtr_parse_u32() - kvtr_parse_u64() for uint32_t destinations. */
int kvtr_parse_u32(const char *what, const char *s, uint32_t min, uint32_t max, uint32_t *out);

/**
 * kvtr_parse_float() - parse a finite float in [min, max] (strtof syntax, whole string).
 * Returns 0 and *out, or -EINVAL.
 */
int kvtr_parse_float(const char *what, const char *s, float min, float max, float *out);

/** A growable NUL-terminated string (text of one session's turn). */
struct kvtr_str {
	char *buf;  /* NUL-terminated contents; NULL until the first append */
	size_t len; /* bytes before the NUL */
	size_t cap; /* bytes allocated */
};

/** kvtr_str_append() - append @s. Returns 0 or -ENOMEM (the string is unchanged then). */
int kvtr_str_append(struct kvtr_str *str, const char *s);

/** kvtr_str_cstr() - the contents ("" when empty); valid until the next append or free. */
const char *kvtr_str_cstr(const struct kvtr_str *str);

/** kvtr_str_free() - free the buffer and reset to empty. */
void kvtr_str_free(struct kvtr_str *str);

#endif /* KVTR_UTIL_H */
