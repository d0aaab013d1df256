/* SPDX-License-Identifier: MIT */
/*
 * tiers/store.c - the journal of published sessions and its in-memory index (see store.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/base/alloc.h"
#include "tiers/base/error.h"
#include "tiers/store.h"

#define STORE_JOURNAL "kvtier.journal"
#define STORE_NIL UINT32_MAX

struct kvt_store {
	char *dir;                     /* directory; owned */
	char *path;                    /* journal path; owned */
	int fd;                        /* journal, O_APPEND is not used: writes go to end */
	uint64_t end;                  /* journal bytes (next record's offset) */
	uint64_t live_bytes;           /* bytes the live records take (compaction estimate) */
	uint64_t next_seqno;           /* seqno of the next record */
	uint64_t store_id;             /* id of the store this journal belongs to */
	uint32_t n_slots;              /* slots of the store (references beyond are dropped) */
	struct kvt_fmt_limits lim;     /* what records must fit (kvt_fmt_rec_check) */
	uint32_t invalid;              /* open: records that verified but failed the field
	                                  checks; their sessions were dropped */
	char invalid_msg[256];         /* open: why the first of them failed */
	uint32_t n, cap;               /* sessions in use / capacity */
	int failed;                    /* -errno of a failed fdatasync (final), else 0 */
	uint64_t damaged_at;           /* open: the journal did not verify from this offset on,
	                                  though it was no torn tail (0 = it verified, or was
	                                  torn at its end); the original is kept (.damaged) */
	uint32_t dropped;              /* open: valid records after the damage, not replayed */
	uint64_t orphan_id;            /* open: the journal found was another store's (0 =
	                                  none): replaced */
	uint64_t gen;                  /* generation of the journal file (its header) */
	uint64_t changes;              /* sessions inserted or removed in the index so far */
	uint64_t durable;              /* journal bytes known durable (last commit) */
	uint64_t ack_gen, ack_len;     /* open: what the superblock knew durable */
	bool short_found;              /* open: the journal ends (verifies) before ack_len */
	uint64_t short_at;             /* ... at this offset (0: no journal at all) */
	struct kvt_store_sess **sess;  /* [cap] */
};

const struct kvt_sync_hook *kvt_test_sync_hook;

void
kvt_sync_note(int ev, uint64_t key, const struct kvt_fmt_blkref *blocks, uint32_t n)
{
	const struct kvt_sync_hook *h = kvt_test_sync_hook;

	if (h && h->fn)
		h->fn(h->arg, ev, key, blocks, n);
}

int
kvt_sync_fd(int fd, int ev)
{
	const struct kvt_sync_hook *h = kvt_test_sync_hook;
	int inj = h && h->fail ? h->fail(h->arg, ev) : 0;

	if (inj)
		return -inj;
	if (fdatasync(fd) != 0)
		return -errno;
	kvt_sync_note(ev, 0, NULL, 0);
	return 0;
}

void
kvt_fsync_dir(const char *dir)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd >= 0) {
		(void)fsync(dfd);
		close(dfd);
	}
}

static void
store_sess_free(struct kvt_store_sess *s)
{
	if (!s)
		return;
	kvt_free(s->tokens);
	kvt_free(s->blocks);
	kvt_free(s);
}

static int
store_index_of(const struct kvt_store *st, uint64_t key)
{
	for (uint32_t i = 0; i < st->n; i++)
		if (st->sess[i]->key == key)
			return (int)i;
	return -1;
}

static void
store_remove_at(struct kvt_store *st, uint32_t i)
{
	st->changes++;
	st->live_bytes -= kvt_fmt_put_bytes(st->sess[i]->n_blocks, st->sess[i]->n_tokens);
	store_sess_free(st->sess[i]);
	st->sess[i] = st->sess[--st->n];
}

/* Insert @s (owned from now on), replacing a session with the same key. */
static int
store_insert(struct kvt_store *st, struct kvt_store_sess *s)
{
	int i = store_index_of(st, s->key);
	void *p;

	if (i >= 0)
		store_remove_at(st, (uint32_t)i);
	if (st->n == st->cap) {
		uint32_t c = st->cap ? st->cap * 2 : 16;

		if (!(p = kvt_realloc(st->sess, (size_t)c * sizeof *st->sess))) {
			store_sess_free(s);
			return kvt_err(-ENOMEM, "store index of %u sessions", c);
		}
		st->sess = p;
		st->cap = c;
	}
	st->sess[st->n++] = s;
	st->changes++;
	st->live_bytes += kvt_fmt_put_bytes(s->n_blocks, s->n_tokens);
	return 0;
}

static struct kvt_store_sess *
store_sess_new(uint64_t key, uint64_t seqno, uint32_t tenant, uint32_t priority,
	       uint64_t n_tokens, uint32_t n_blocks)
{
	struct kvt_store_sess *s = kvt_calloc(1, sizeof *s);

	if (!s)
		return NULL;
	s->key = key;
	s->seqno = seqno;
	s->tenant = tenant;
	s->priority = priority;
	s->n_tokens = n_tokens;
	s->n_blocks = n_blocks;
	s->open_seq = STORE_NIL;
	s->tokens = kvt_malloc(n_tokens ? n_tokens * sizeof *s->tokens : 1);
	s->blocks = kvt_malloc(n_blocks ? n_blocks * sizeof *s->blocks : 1);
	if (!s->tokens || !s->blocks) {
		store_sess_free(s);
		return NULL;
	}
	return s;
}

/* Apply one decoded record to the index. A record that fails the field checks drops its session
 * (an earlier PUT of it included: this one was to replace it) and is counted in st->invalid. */
static int
store_apply(struct kvt_store *st, const struct kvt_fmt_rec *r)
{
	struct kvt_store_sess *s;
	int i;

	if (kvt_fmt_rec_check(r, &st->lim) != 0) {
		if (st->invalid++ == 0)
			snprintf(st->invalid_msg, sizeof st->invalid_msg, "%s",
				 kvt_last_error_message());
		i = store_index_of(st, r->session);
		if (i >= 0)
			store_remove_at(st, (uint32_t)i);
		return 0;
	}
	if (r->seqno >= st->next_seqno)
		st->next_seqno = r->seqno + 1;
	if (r->type == KVT_FMT_REC_DEL) {
		i = store_index_of(st, r->session);
		if (i >= 0)
			store_remove_at(st, (uint32_t)i);
		return 0;
	}
	s = store_sess_new(r->session, r->seqno, r->tenant, r->priority, r->n_tokens,
			   r->n_blocks);
	if (!s)
		return kvt_err(-ENOMEM, "store: session of %llu tokens",
			       (unsigned long long)r->n_tokens);
	for (uint32_t b = 0; b < r->n_blocks; b++)
		kvt_fmt_rec_block(r, b, &s->blocks[b]);
	for (uint64_t t = 0; t < r->n_tokens; t++)
		s->tokens[t] = kvt_fmt_rec_token(r, t);
	return store_insert(st, s);
}

static int
store_by_seqno_desc(const void *a, const void *b)
{
	const struct kvt_store_sess *x = *(struct kvt_store_sess *const *)a;
	const struct kvt_store_sess *y = *(struct kvt_store_sess *const *)b;

	return x->seqno < y->seqno ? 1 : x->seqno > y->seqno ? -1 : 0;
}

/* One slot's write as a record names it: tag and length code. */
static uint64_t
store_write_id(const struct kvt_fmt_blkref *r)
{
	return (uint64_t)r->tag | (uint64_t)r->lenc << 32;
}

/*
 * Drop sessions that refer to slots out of range, to one slot twice, or to a slot that a later
 * session names with another write (its data were overwritten when the later one was written):
 * newest first, a session is kept only when each of its slots is unclaimed by the sessions kept
 * before it or claimed by them with the same write (tag and length code). Several sessions
 * naming one write are sessions sharing a prefix block (kvt_seq_attach_prefix, the prefix cache,
 * or an attach from a stored session): they are all kept.
 */
static int
store_resolve(struct kvt_store *st)
{
	size_t ns = st->n_slots ? st->n_slots : 1;
	uint32_t *seen = kvt_calloc(ns, sizeof *seen);
	uint64_t *claim = kvt_calloc(ns, sizeof *claim); /* write id + 1 of the kept claim */
	struct kvt_store_sess **ord = kvt_malloc((st->n ? st->n : 1) * sizeof *ord);
	uint32_t n = st->n, i, b, k;

	if (!seen || !claim || !ord) {
		kvt_free(seen);
		kvt_free(claim);
		kvt_free(ord);
		return kvt_err(-ENOMEM, "store: slot claims for %u slots", st->n_slots);
	}
	if (n)
		memcpy(ord, st->sess, n * sizeof *ord);
	qsort(ord, n, sizeof *ord, store_by_seqno_desc);
	for (i = 0; i < n; i++) {
		struct kvt_store_sess *s = ord[i];
		bool keep = true;

		for (b = 0; b < s->n_blocks && keep; b++) {
			uint32_t sl = s->blocks[b].slot;
			uint64_t w = store_write_id(&s->blocks[b]) + 1;

			if (sl == KVT_FMT_HOLE)
				continue; /* out of a sliding window: claims no slot */
			keep = sl < st->n_slots && seen[sl] != i + 1 &&
			       (!claim[sl] || claim[sl] == w);
			if (keep) {
				seen[sl] = i + 1;
			} else if (sl >= st->n_slots || seen[sl] == i + 1) {
				/* no write of kvtier names a slot twice (or out of range): a record
				 * that verifies and does is damage or forgery, reported like the
				 * other bad fields; a slot another write took is no damage */
				if (st->invalid++ == 0)
					snprintf(st->invalid_msg, sizeof st->invalid_msg,
						 "session %#llx names slot %u %s",
						 (unsigned long long)s->key, sl,
						 sl >= st->n_slots ? "out of range" : "twice");
			}
		}
		for (b = 0; b < s->n_blocks && keep; b++)
			if (s->blocks[b].slot != KVT_FMT_HOLE)
				claim[s->blocks[b].slot] = store_write_id(&s->blocks[b]) + 1;
		if (keep)
			ord[i] = NULL;
	}
	for (i = 0; i < n; i++)
		for (k = 0; ord[i] && k < st->n; k++)
			if (st->sess[k] == ord[i]) {
				store_remove_at(st, k);
				break;
			}
	kvt_free(seen);
	kvt_free(claim);
	kvt_free(ord);
	return 0;
}

/* Valid records in @buf from @off on (8-byte steps: records are padded to 8 bytes). Any means
 * the record at @off is damage, not a torn tail: a torn append leaves nothing valid after it. */
static uint32_t
store_valid_after(const uint8_t *buf, size_t len, size_t off)
{
	struct kvt_fmt_rec r;
	uint32_t n = 0;
	size_t used;

	for (off += 8; off + KVT_FMT_RECHDR_BYTES <= len; off += 8)
		if (kvt_fmt_rec_decode(buf + off, len - off, &r, &used) == 0)
			n++;
	return n;
}

/* Apply the records of the journal image @buf (@len bytes, header first) up to the first one
 * that does not verify, then resolve slot conflicts. A record that does not verify with valid
 * ones after it is damage, not a torn tail: recorded in st->damaged_at and st->dropped. */
static int
store_replay_buf(struct kvt_store *st, const uint8_t *buf, size_t len, size_t *stop)
{
	size_t off = KVT_FMT_JHDR_BYTES, used;
	struct kvt_fmt_rec r;
	int rc = 0;

	while (rc == 0 && off < len && kvt_fmt_rec_decode(buf + off, len - off, &r, &used) == 0) {
		rc = store_apply(st, &r);
		off += used;
	}
	if (rc == 0 && off < len && (st->dropped = store_valid_after(buf, len, off)) > 0)
		st->damaged_at = off;
	*stop = off;
	return rc ? rc : store_resolve(st);
}

static int store_write_all(int fd, const uint8_t *p, size_t n, uint64_t off);

bool kvt_test_store_no_link;

/* An earlier damage's copy @kept (".damaged") moves to ".damaged.N", the first N of 1..999 not
 * taken, so every damage found keeps its evidence (the newest is always ".damaged"; the numbers
 * give no order once some were deleted); with all 999 taken ".damaged" is replaced. A copy that
 * already holds exactly @buf (the same damage found again, e.g. by an open whose compaction then
 * failed) is left as it is: *@same is set and nothing is to be kept again. */
static void
store_rotate_damaged(const char *kept, const uint8_t *buf, size_t len, bool *same)
{
	size_t plen = strlen(kept) + 8;
	char *old = kvt_malloc(plen);
	struct stat sb;

	*same = false;
	if (!old || stat(kept, &sb) != 0) {
		kvt_free(old);
		return;
	}
	if ((uint64_t)sb.st_size == len) {
		uint8_t *have = kvt_malloc(len ? len : 1);
		int fd = have ? open(kept, O_RDONLY | O_CLOEXEC) : -1;

		*same = fd >= 0 && pread(fd, have, len, 0) == (ssize_t)len &&
			memcmp(have, buf, len) == 0;
		if (fd >= 0)
			close(fd);
		kvt_free(have);
		if (*same) {
			kvt_free(old);
			return;
		}
	}
	for (unsigned n = 1; n < 1000; n++) {
		snprintf(old, plen, "%s.%u", kept, n);
		if (lstat(old, &sb) != 0 && errno == ENOENT) {
			(void)rename(kept, old);
			break;
		}
	}
	kvt_free(old);
}

/* Keep the journal as it was, @buf (@len bytes), as "<journal>.damaged" (an older copy moves
 * aside: store_rotate_damaged) before compaction replaces it, so that what did not replay can
 * still be looked at: a hard link, or where the filesystem has none a copy, made durable (fsync,
 * rename, directory fsync). 0, or the error (then the journal must not be compacted:
 * kvt_store_open fails). */
static int
store_keep_damaged(struct kvt_store *st, const uint8_t *buf, size_t len)
{
	size_t plen = strlen(st->path) + sizeof ".damaged.tmp";
	char *kept = kvt_malloc(plen), *tmp = kvt_malloc(plen);
	int fd = -1, rc = 0;
	bool same;

	if (!kept || !tmp) {
		rc = -ENOMEM;
		goto out;
	}
	snprintf(kept, plen, "%s.damaged", st->path);
	snprintf(tmp, plen, "%s.damaged.tmp", st->path);
	store_rotate_damaged(kept, buf, len, &same);
	if (same)
		goto out; /* this damage is kept already */
	(void)unlink(tmp);
	if (kvt_test_store_no_link || link(st->path, tmp) != 0) {
		fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		rc = fd < 0 ? -errno : store_write_all(fd, buf, len, 0);
		if (rc == 0 && fsync(fd) != 0)
			rc = -errno;
		if (fd >= 0)
			close(fd);
	}
	if (rc == 0 && rename(tmp, kept) != 0)
		rc = -errno;
	if (rc != 0) {
		(void)unlink(tmp);
		goto out;
	}
	kvt_fsync_dir(st->dir);
out:
	if (rc != 0)
		rc = kvt_err(rc, "store: keeping the damaged journal %s as %s.damaged failed; it is "
			     "not used nor changed", st->path, st->path);
	kvt_free(kept);
	kvt_free(tmp);
	return rc;
}

/* Read the whole journal into memory and replay it; cut a torn tail. A journal of another format
 * version is refused (KVT_EFORMAT, the file untouched); one of another store (a crash between
 * creating the store and its journal) is replaced; a damaged one (header or a record in the
 * middle) replays what verifies, and the original is kept (store_keep_damaged). */
static int
store_replay(struct kvt_store *st, bool fresh)
{
	uint64_t id = 0, found_gen;
	uint8_t *buf = NULL;
	struct stat sb;
	size_t stop;
	uint32_t ver;
	ssize_t got;
	int rc;

	if (fstat(st->fd, &sb) != 0)
		return kvt_err(-errno, "store: fstat %s", st->path);
	if (fresh)
		return 0;
	if (sb.st_size == 0) {
		/* gone (or never written): a loss only if the superblock knew records in it */
		st->short_found = st->ack_len > KVT_FMT_JHDR_BYTES;
		st->short_at = 0;
		return 0;
	}
	buf = kvt_malloc((size_t)sb.st_size);
	if (!buf)
		return kvt_err(-ENOMEM, "store: journal of %lld bytes", (long long)sb.st_size);
	got = pread(st->fd, buf, (size_t)sb.st_size, 0);
	if (got != sb.st_size) {
		kvt_free(buf);
		return kvt_err(-EIO, "store: reading %s", st->path);
	}
	ver = kvt_fmt_jhdr_version(buf, (size_t)got);
	if (ver && ver != KVT_FMT_VERSION) {
		kvt_free(buf);
		return kvt_err(KVT_EFORMAT, "store: journal %s is of format version %u, this kvtier "
			       "reads %u (not used, not changed; move the store directory's files "
			       "away to start an empty store)", st->path, ver, KVT_FMT_VERSION);
	}
	if (kvt_fmt_jhdr_decode(buf, (size_t)got, &id) != 0) {
		st->damaged_at = 1; /* the header itself */
		st->dropped = store_valid_after(buf, (size_t)got, 0);
		rc = store_keep_damaged(st, buf, (size_t)got);
		kvt_free(buf);
		return rc;
	}
	if (id != st->store_id) {
		st->orphan_id = id; /* another store's journal: its sessions were not this store's */
		kvt_free(buf);
		return 0;
	}
	rc = store_replay_buf(st, buf, (size_t)got, &stop);
	found_gen = kvt_fmt_jhdr_gen(buf);
	/* the superblock knew this generation durable up to ack_len: a journal that verifies
	 * less of it (cut, zeroed), or an older generation, lost acknowledged records */
	if (st->ack_len && (found_gen < st->ack_gen ||
			    (found_gen == st->ack_gen && stop < st->ack_len))) {
		st->short_found = true;
		st->short_at = stop;
	}
	if (found_gen > st->gen)
		st->gen = found_gen;
	if (rc == 0 && (st->damaged_at || st->short_found))
		rc = store_keep_damaged(st, buf, (size_t)got);
	kvt_free(buf);
	return rc;
}

int
kvt_store_fuzz_one(const uint8_t *data, size_t len)
{
	struct kvt_store st = {
		.fd = -1, .n_slots = 64, .next_seqno = 1,
		.lim = { .n_slots = 64, .tokens_per_block = 16, .block_bytes = 8192,
			 .codec = KVT_CODEC_NONE }, /* as tests/fuzz/mkseeds.c writes */
	};
	uint64_t claimed[64] = { 0 }; /* write id + 1 of the first session naming the slot */
	uint32_t seen[64] = { 0 };
	size_t stop;
	int n;

	if (kvt_fmt_jhdr_decode(data, len, &st.store_id) != 0)
		return 0;
	(void)store_replay_buf(&st, data, len, &stop);
	n = (int)st.n;
	/* what replay guarantees the engine: one session per key, fields that pass
	 * kvt_fmt_rec_check (n_blocks == ceil(n_tokens / 16), ...), slots in range, no slot
	 * named twice by one session, and sessions naming one slot name the same write */
	for (uint32_t i = 0; i < st.n; i++) {
		const struct kvt_store_sess *s = st.sess[i];

		if (kvt_store_find(&st, s->key) != s || s->key == 0 || s->priority > 100 ||
		    s->n_blocks != (s->n_tokens + 15) / 16 || s->seqno == 0 ||
		    s->seqno > KVT_FMT_MAX_SEQNO)
			n = -1;
		for (uint32_t b = 0; b < s->n_blocks; b++) {
			uint32_t sl = s->blocks[b].slot;
			uint64_t w = store_write_id(&s->blocks[b]) + 1;

			if (sl == KVT_FMT_HOLE)
				continue; /* a hole names no slot */
			if (sl >= st.n_slots || seen[sl] == i + 1 || (claimed[sl] && claimed[sl] != w) ||
			    !kvt_fmt_lenc_bytes(s->blocks[b].lenc, st.lim.block_bytes)) {
				n = -1;
				continue;
			}
			seen[sl] = i + 1;
			claimed[sl] = w;
		}
	}
	for (uint32_t i = 0; i < st.n; i++)
		store_sess_free(st.sess[i]);
	kvt_free(st.sess);
	return n;
}

static int
store_write_all(int fd, const uint8_t *p, size_t n, uint64_t off)
{
	while (n > 0) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

static int
store_encode_put(const struct kvt_store_sess *s, uint8_t **out, size_t *len)
{
	size_t n = kvt_fmt_put_bytes(s->n_blocks, s->n_tokens);

	if (n == 0)
		return kvt_err(-EINVAL, "store: session of %llu tokens is too large to record",
			       (unsigned long long)s->n_tokens);
	*out = kvt_malloc(n);
	if (!*out)
		return kvt_err(-ENOMEM, "store: record of %zu bytes", n);
	kvt_fmt_put_encode(*out, s->seqno, s->key, s->tenant, s->priority, s->blocks, s->n_blocks,
			   s->tokens, s->n_tokens);
	*len = n;
	return 0;
}

/* Rewrite the journal with only the live records: tmp file, fsync, rename, fsync dir. */
static int
store_compact(struct kvt_store *st)
{
	size_t plen = strlen(st->path) + 8, len;
	char *tmp = kvt_malloc(plen);
	uint8_t hdr[KVT_FMT_JHDR_BYTES], *rec;
	uint64_t off = KVT_FMT_JHDR_BYTES;
	int fd, rc = 0;

	if (!tmp)
		return kvt_err(-ENOMEM, "store: path");
	snprintf(tmp, plen, "%s.tmp", st->path);
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = kvt_err(-errno, "store: creating %s", tmp);
		kvt_free(tmp);
		return rc;
	}
	kvt_fmt_jhdr_encode_gen(st->store_id, st->gen + 1, hdr);
	rc = store_write_all(fd, hdr, sizeof hdr, 0);
	for (uint32_t i = 0; rc == 0 && i < st->n; i++) {
		rc = store_encode_put(st->sess[i], &rec, &len);
		if (rc == 0) {
			rc = store_write_all(fd, rec, len, off);
			off += len;
			kvt_free(rec);
		}
	}
	if (rc == 0 && fchmod(fd, 0600) != 0)
		rc = -errno;
	if (rc == 0)
		rc = kvt_sync_fd(fd, KVT_SYNC_COMPACT);
	if (rc == 0 && rename(tmp, st->path) != 0)
		rc = -errno;
	if (rc != 0) {
		close(fd);
		unlink(tmp);
		kvt_free(tmp);
		return kvt_err(rc, "store: compacting %s", st->path);
	}
	kvt_free(tmp);
	kvt_fsync_dir(st->dir);
	if (st->fd >= 0)
		close(st->fd);
	st->fd = fd;
	st->end = st->durable = off;
	st->gen++;
	return 0;
}

int
kvt_store_open(const char *dir, uint64_t store_id, const struct kvt_fmt_limits *lim, bool fresh,
	       struct kvt_store **out)
{
	return kvt_store_open_acked(dir, store_id, lim, fresh, 0, 0, out);
}

int
kvt_store_open_acked(const char *dir, uint64_t store_id, const struct kvt_fmt_limits *lim,
		     bool fresh, uint64_t ack_gen, uint64_t ack_len, struct kvt_store **out)
{
	struct kvt_store *st;
	size_t plen = strlen(dir) + sizeof STORE_JOURNAL + 2;
	int rc;

	*out = NULL;
	st = kvt_calloc(1, sizeof *st);
	if (!st || !(st->path = kvt_malloc(plen)) || !(st->dir = kvt_malloc(strlen(dir) + 1))) {
		kvt_store_close(st);
		return kvt_err(-ENOMEM, "store object");
	}
	memcpy(st->dir, dir, strlen(dir) + 1);
	snprintf(st->path, plen, "%s/%s", dir, STORE_JOURNAL);
	st->store_id = store_id;
	st->n_slots = lim->n_slots;
	st->lim = *lim;
	st->next_seqno = 1;
	st->ack_gen = st->gen = fresh ? 0 : ack_gen;
	st->ack_len = fresh ? 0 : ack_len;
	st->fd = open(st->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (st->fd < 0) {
		rc = kvt_err(-errno, "store: opening %s", st->path);
		kvt_store_close(st);
		return rc;
	}
	rc = store_replay(st, fresh);
	if (rc == 0)
		rc = store_compact(st);
	if (rc != 0) {
		kvt_store_close(st);
		return rc;
	}
	*out = st;
	return 0;
}

void
kvt_store_close(struct kvt_store *st)
{
	if (!st)
		return;
	if (st->fd >= 0)
		close(st->fd);
	for (uint32_t i = 0; i < st->n; i++)
		store_sess_free(st->sess[i]);
	kvt_free(st->sess);
	kvt_free(st->path);
	kvt_free(st->dir);
	kvt_free(st);
}

uint64_t
kvt_store_damaged(const struct kvt_store *st, uint32_t *dropped, uint64_t *orphan_id)
{
	if (dropped)
		*dropped = st->dropped;
	if (orphan_id)
		*orphan_id = st->orphan_id;
	return st->damaged_at;
}

bool
kvt_store_short(const struct kvt_store *st, uint64_t *found, uint64_t *acked)
{
	if (found)
		*found = st->short_at;
	if (acked)
		*acked = st->ack_len;
	return st->short_found;
}

void
kvt_store_durable(const struct kvt_store *st, uint64_t *gen, uint64_t *len)
{
	*gen = st->gen;
	*len = st->durable;
}

uint32_t
kvt_store_invalid(const struct kvt_store *st, const char **first)
{
	if (first)
		*first = st->invalid_msg;
	return st->invalid;
}

uint32_t
kvt_store_count(const struct kvt_store *st)
{
	return st->n;
}

uint64_t
kvt_store_changes(const struct kvt_store *st)
{
	return st->changes;
}

struct kvt_store_sess *
kvt_store_at(struct kvt_store *st, uint32_t i)
{
	return i < st->n ? st->sess[i] : NULL;
}

struct kvt_store_sess *
kvt_store_find(struct kvt_store *st, uint64_t key)
{
	int i = store_index_of(st, key);

	return i < 0 ? NULL : st->sess[i];
}

bool
kvt_store_find_hash(struct kvt_store *st, const uint8_t *hash, struct kvt_store_sess **sess,
		    uint32_t *index)
{
	static const uint8_t zero[16];

	if (!memcmp(hash, zero, 16))
		return false;
	*sess = NULL;
	/* several sessions may share the block: one not open in the engine first */
	for (uint32_t i = 0; i < st->n; i++)
		for (uint32_t b = 0; b < st->sess[i]->n_blocks; b++)
			if (st->sess[i]->blocks[b].slot != KVT_FMT_HOLE &&
			    !memcmp(st->sess[i]->blocks[b].hash, hash, 16) &&
			    (!*sess || (*sess)->open_seq != STORE_NIL)) {
				*sess = st->sess[i];
				*index = b;
				if ((*sess)->open_seq == STORE_NIL)
					return true;
				break;
			}
	return *sess != NULL;
}

int
kvt_store_put(struct kvt_store *st, uint64_t key, uint32_t tenant, uint32_t priority,
	      const int32_t *tokens, uint64_t n_tokens, const struct kvt_fmt_blkref *blocks,
	      uint32_t n_blocks, uint32_t open_seq)
{
	struct kvt_store_sess *s;
	uint8_t *rec;
	size_t len;
	int rc;

	if (st->failed)
		return kvt_err(-EIO, "store: %s failed to sync earlier: no more records", st->path);
	s = store_sess_new(key, st->next_seqno, tenant, priority, n_tokens, n_blocks);
	if (!s)
		return kvt_err(-ENOMEM, "store: session of %llu tokens",
			       (unsigned long long)n_tokens);
	s->open_seq = open_seq;
	if (n_tokens)
		memcpy(s->tokens, tokens, n_tokens * sizeof *tokens);
	if (n_blocks)
		memcpy(s->blocks, blocks, n_blocks * sizeof *blocks);
	rc = store_encode_put(s, &rec, &len);
	if (rc == 0) {
		rc = store_write_all(st->fd, rec, len, st->end);
		kvt_free(rec);
		if (rc != 0)
			rc = kvt_err(rc, "store: appending to %s", st->path);
	}
	if (rc != 0) {
		store_sess_free(s);
		return rc;
	}
	st->end += len;
	st->next_seqno++;
	kvt_sync_note(KVT_SYNC_PUT, key, blocks, n_blocks);
	return store_insert(st, s);
}

int
kvt_store_del(struct kvt_store *st, uint64_t key)
{
	uint8_t rec[KVT_FMT_RECHDR_BYTES + 8];
	int i = store_index_of(st, key), rc;

	if (i < 0)
		return 0;
	if (st->failed)
		return kvt_err(-EIO, "store: %s failed to sync earlier: no more records", st->path);
	kvt_fmt_del_encode(rec, st->next_seqno, key);
	rc = store_write_all(st->fd, rec, sizeof rec, st->end);
	if (rc != 0)
		return kvt_err(rc, "store: appending to %s", st->path);
	st->end += sizeof rec;
	st->next_seqno++;
	kvt_sync_note(KVT_SYNC_DEL, key, NULL, 0);
	store_remove_at(st, (uint32_t)i);
	return 0;
}

int
kvt_store_commit(struct kvt_store *st)
{
	int rc;

	if (st->failed)
		return kvt_err(-EIO, "store: %s failed to sync earlier (%s): no more commits",
			       st->path, strerror(-st->failed));
	rc = kvt_sync_fd(st->fd, KVT_SYNC_JOURNAL);
	if (rc) {
		st->failed = rc; /* the dirty pages may be gone: never report success again */
		return kvt_err(rc, "store: fdatasync %s", st->path);
	}
	st->durable = st->end;
	/* the log only grows between opens: rewrite it when mostly dead records */
	if (st->end > ((uint64_t)1 << 20) && st->end > 4 * st->live_bytes)
		return store_compact(st);
	return 0;
}

bool
kvt_store_failed(const struct kvt_store *st)
{
	return st && st->failed != 0;
}
