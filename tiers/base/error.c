/* SPDX-License-Identifier: MIT */
/* tiers/base/error.c - error codes, kvt_strerror() and the thread-local last-error message. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tiers/base/error.h"

static _Thread_local char kvt_errbuf[512];

const char *
kvt_strerror(int err)
{
	switch (err) {
	case 0:
		return "success";
#define KVT_XX_CASE(name, val, msg)                                                                \
	case val:                                                                                  \
		return msg;
		KVT_ERRNO_MAP(KVT_XX_CASE)
#undef KVT_XX_CASE
	default:
		break;
	}
	if (err < 0 && err > -4096) {
		/* strerror() is not thread-safe in general: every errno value the engine returns
		 * itself has its name here, and so have those its system calls pass on */
		switch (-err) {
		case EINVAL: return "invalid argument";
		case ENOMEM: return "out of memory";
		case ENOSPC: return "no space left in the tiers";
		case EIO: return "I/O error";
		case ENOENT: return "no such file or directory";
		case EACCES: return "permission denied";
		case ENOTDIR: return "not a directory";
		case EAGAIN: return "resource temporarily unavailable; try again";
		case EROFS: return "read-only file system";
		case EEXIST: return "file exists";
		case EBUSY: return "resource busy (in use by another process or call)";
		case EPERM: return "operation not permitted (belongs to another tenant or owner)";
		case ETIMEDOUT: return "timed out";
		case ETIME: return "timer expired";
		case EINTR: return "interrupted system call";
		case EDEADLK: return "no progress possible (would wait for ever)";
		case EBADF: return "bad file descriptor";
		case EFAULT: return "bad address";
		case EFBIG: return "file too large";
		case EISDIR: return "is a directory";
		case EMFILE: return "too many open files";
		case ENFILE: return "too many open files in system";
		case ENAMETOOLONG: return "file name too long";
		case ENODEV: return "no such device";
		case ENXIO: return "no such device or address";
		case EOPNOTSUPP: return "operation not supported";
		case ENOSYS: return "function not implemented";
		case ELOOP: return "too many levels of symbolic links";
		case EOVERFLOW: return "value too large for defined data type";
		case EDQUOT: return "disk quota exceeded";
		case ECANCELED: return "operation canceled";
		default: return "system error";
		}
	}
	return "unknown error";
}

const char *
kvt_last_error_message(void)
{
	return kvt_errbuf;
}

/* A message that wraps the one before it of the same code repeats its "<strerror>: " prefix
 * ("file is not in the expected format: engine: file is not in the expected format: ..."): drop
 * the copies that start a wrapped part (right after a ": ", the prefix's own included: a wrap
 * of the whole message) past the first @plen bytes (the prefix itself); the same words
 * elsewhere (inside a path) stay. */
static void
err_drop_repeats(char *msg, size_t plen)
{
	char pre[132], *p = msg + plen - 2; /* from the prefix's own ": ": a wrap right after it */

	if (plen <= 2 || plen + 2 >= sizeof pre)
		return;
	pre[0] = ':';
	pre[1] = ' ';
	memcpy(pre + 2, msg, plen);
	pre[plen + 2] = '\0';
	while ((p = strstr(p, pre)) != NULL)
		memmove(p + 2, p + 2 + plen, strlen(p + 2 + plen) + 1);
}

int
kvt_err(int code, const char *fmt, ...)
{
	char msg[2 * sizeof kvt_errbuf]; /* room to drop repeats before cutting to size */
	va_list ap;
	int n;

	/* formatted aside first: an argument may be kvt_last_error_message() itself (a message
	 * that wraps the one before it), which writing kvt_errbuf in place would clobber */
	n = snprintf(msg, sizeof msg, "%s: ", kvt_strerror(code));
	if (n < 0 || (size_t)n >= sizeof msg)
		return code;
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
	va_end(ap);
	err_drop_repeats(msg, (size_t)n);
	memcpy(kvt_errbuf, msg, sizeof kvt_errbuf - 1);
	kvt_errbuf[sizeof kvt_errbuf - 1] = '\0';
	return code;
}

void
kvt_err_clear(void)
{
	kvt_errbuf[0] = '\0';
}
