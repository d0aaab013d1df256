/* SPDX-License-Identifier: MIT */
/*
 * tiers/base/error.h - internal error reporting: every failing path calls kvt_err() once, which
 * records a formatted message for kvt_last_error_message() (thread-local) and returns the code,
 * so a failure reads `return kvt_err(-EINVAL, "tokens_per_block %u out of range", tpb);`.
 */
#ifndef KVT_BASE_ERROR_H
#define KVT_BASE_ERROR_H

#include "kvtier.h"

#if defined(__GNUC__)
#define KVT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KVT_PRINTF(a, b)
#endif

/** Record "msg" as the calling thread's last error message and return @code. */
int kvt_err(int code, const char *fmt, ...) KVT_PRINTF(2, 3);

/** Clear the calling thread's last error message. */
void kvt_err_clear(void);

#endif /* KVT_BASE_ERROR_H */
