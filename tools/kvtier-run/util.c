/* SPDX-License-Identifier: MIT */
/* tools/kvtier-run/util.c - last-error message, command-line value parsers, clock, growable
 * string. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tiers/base/clock.h"
#include "util.h"

static _Thread_local char util_errbuf[1024];

int
kvtr_err(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(util_errbuf, sizeof(util_errbuf), fmt, ap);
	va_end(ap);
	return code;
}

/*
 * Copies @detail into @buf (size @cap) without the repeats of "<name>: " after its first
 * occurrence: the library nests messages (a tier's message inside the engine's, each made by
 * kvt_err with the code's name in front), which would otherwise read "no such file or directory:
 * NVME tier in X: no such file or directory: ...".
 */
static void
util_drop_repeats(char *buf, size_t cap, const char *detail, const char *name)
{
	size_t nl = strlen(name), len = 0;
	const char *first = strstr(detail, name);
	const char *p = detail;

	while (*p && len + 1 < cap) {
		if (first && p > first && strncmp(p, name, nl) == 0 && p[nl] == ':' &&
		    p[nl + 1] == ' ') {
			p += nl + 2;
			continue;
		}
		buf[len++] = *p++;
	}
	buf[len] = '\0';
}

int
kvtr_err_kvt(int code, const char *what)
{
	const char *detail = kvt_last_error_message();
	char msg[sizeof(util_errbuf)];

	/* the library's message names the error itself: print it alone, never the name and
	 * the message */
	if (!detail || !detail[0])
		return kvtr_err(code, "%s: %s", what, kvt_strerror(code));
	util_drop_repeats(msg, sizeof(msg), detail, kvt_strerror(code));
	return kvtr_err(code, "%s: %s", what, msg);
}

const char *
kvtr_last_error(void)
{
	return util_errbuf;
}

uint64_t
kvtr_now_ns(void)
{
	return kvt_now_ns(); /* the library's one clock */
}

double
kvtr_now(void)
{
	return (double)kvtr_now_ns() * 1e-9;
}

/* Parse the leading decimal digits of s into *v; returns the first unparsed char, or NULL when
 * there is no digit. *overflow is set to 1 (and *v to UINT64_MAX) when the digits exceed
 * UINT64_MAX; the whole run of digits is consumed either way. */
static const char *
util_parse_digits(const char *s, uint64_t *v, int *overflow)
{
	uint64_t acc = 0;
	const char *p = s;

	*overflow = 0;
	if (!isdigit((unsigned char)*p))
		return NULL;
	for (; isdigit((unsigned char)*p); p++) {
		uint64_t d = (uint64_t)(*p - '0');

		if (acc > (UINT64_MAX - d) / 10) {
			*overflow = 1;
			acc = UINT64_MAX;
		} else if (!*overflow) {
			acc = acc * 10 + d;
		}
	}
	*v = acc;
	return p;
}

/* Multiplier of a size suffix: "" 1, K/M/G/T/P powers of 1024 (either case), each optionally
 * followed by "iB" or "B"; a lone "B" is bytes. 0 when it is none of those. */
static uint64_t
util_size_suffix(const char *p)
{
	static const char units[] = "KMGTP";
	const char *u;
	uint64_t mult = 1;

	if (*p == '\0' || ((*p == 'B' || *p == 'b') && p[1] == '\0'))
		return 1;
	u = strchr(units, toupper((unsigned char)*p));
	if (!u || !*p)
		return 0;
	mult <<= 10 * (u - units + 1);
	p++;
	if (*p == 'i')
		p++;
	if (*p == 'B' || *p == 'b')
		p++;
	return *p == '\0' ? mult : 0;
}

#define UTIL_SIZE_FORM "bytes, optionally with a fraction and a binary K, M, G, T or P suffix, " \
	"e.g. 64M, 1.5G, 4T"

int
kvtr_parse_bytes(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v, mult, frac_bytes = 0;
	const char *p, *q;
	double frac = 0.0;
	int overflow;

	if (!s || !*s)
		return kvtr_err(-EINVAL, "%s: empty size (expected " UTIL_SIZE_FORM ")", what);
	p = util_parse_digits(s, &v, &overflow);
	if (!p)
		return kvtr_err(-EINVAL, "%s: '%s' is not a size (expected " UTIL_SIZE_FORM ")",
				what, s);
	if (*p == '.') {
		q = p + 1;
		if (!isdigit((unsigned char)*q))
			return kvtr_err(-EINVAL, "%s: '%s' is not a size (expected "
					UTIL_SIZE_FORM ")", what, s);
		frac = strtod(p, NULL); /* "." and digits: a value in [0, 1) */
		for (p = q; isdigit((unsigned char)*p); p++)
			;
	}
	mult = util_size_suffix(p);
	if (!mult)
		return kvtr_err(-EINVAL, "%s: '%s' has an unknown suffix '%s' (use K, M, G, T or P, "
				"powers of 1024)", what, s, p);
	if (frac > 0.0) {
		frac_bytes = (uint64_t)llround(frac * (double)mult);
		if ((double)frac_bytes != frac * (double)mult)
			return kvtr_err(-EINVAL, "%s: '%s' is not a whole number of bytes", what, s);
	}
	if (overflow || v > (UINT64_MAX - frac_bytes) / mult || v * mult + frac_bytes > max) {
		if (max == KVTR_SIZE_MAX)
			return kvtr_err(-EINVAL, "%s: size '%s' is out of range (more than 1 PiB, "
					"the largest tier kvtier accepts)", what, s);
		return kvtr_err(-EINVAL, "%s: size '%s' is out of range (more than %llu bytes)",
				what, s, (unsigned long long)max);
	}
	v = v * mult + frac_bytes;
	if (v < min)
		return min == 1 ? kvtr_err(-EINVAL, "%s: size must be greater than zero", what)
				: kvtr_err(-EINVAL, "%s: size '%s' is below the minimum %llu bytes",
					   what, s, (unsigned long long)min);
	*out = v;
	return 0;
}

int
kvtr_parse_size(const char *what, const char *s, uint64_t *out)
{
	return kvtr_parse_bytes(what, s, 1, KVTR_SIZE_MAX, out);
}

int
kvtr_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v;
	const char *p;
	int overflow;

	if (!s || !*s)
		return kvtr_err(-EINVAL, "%s: empty value (expected an integer)", what);
	p = util_parse_digits(s, &v, &overflow);
	if (!p || *p != '\0')
		return kvtr_err(-EINVAL, "%s: '%s' is not a non-negative integer", what, s);
	if (overflow || v < min || v > max)
		return kvtr_err(-EINVAL, "%s: %s is out of range [%llu, %llu]", what, s,
				(unsigned long long)min, (unsigned long long)max);
	*out = v;
	return 0;
}

int
kvtr_parse_u32(const char *what, const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
	uint64_t v;
	int rc = kvtr_parse_u64(what, s, min, max, &v);

	if (rc == 0)
		*out = (uint32_t)v;
	return rc;
}

int
kvtr_parse_float(const char *what, const char *s, float min, float max, float *out)
{
	char *end = NULL;
	float v;

	if (!s || !*s || isspace((unsigned char)*s))
		return kvtr_err(-EINVAL, "%s: empty value (expected a number)", what);
	errno = 0;
	v = strtof(s, &end);
	if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v))
		return kvtr_err(-EINVAL, "%s: '%s' is not a finite number", what, s);
	if (v < min || v > max)
		return kvtr_err(-EINVAL, "%s: %s is out of range [%g, %g]", what, s, (double)min,
				(double)max);
	*out = v;
	return 0;
}

int
kvtr_str_append(struct kvtr_str *str, const char *s)
{
	size_t n = strlen(s);

	if (str->len + n + 1 > str->cap) {
		size_t cap = str->cap ? str->cap : 64;
		char *nb;

		while (cap < str->len + n + 1)
			cap *= 2;
		nb = realloc(str->buf, cap);
		if (!nb)
			return kvtr_err(-ENOMEM, "out of memory growing a text buffer to %zu bytes",
					cap);
		str->buf = nb;
		str->cap = cap;
	}
	memcpy(str->buf + str->len, s, n + 1);
	str->len += n;
	return 0;
}

const char *
kvtr_str_cstr(const struct kvtr_str *str)
{
	return str->buf ? str->buf : "";
}

void
kvtr_str_free(struct kvtr_str *str)
{
	free(str->buf);
	str->buf = NULL;
	str->len = 0;
	str->cap = 0;
}
