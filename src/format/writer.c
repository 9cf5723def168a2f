/*
 * Dataset writer: records into shards of a target size, entries into a
 * side file, and at close an index written to a temporary name, synced
 * and renamed last, so a killed writer never leaves a complete-looking
 * dataset.  An overwrite writes the new dataset into a directory beside
 * the old one and swaps the two in one rename at close.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <zstd.h>

#include "format/format.h"

#define SL_WBUF (4u << 20)

struct sluice_writer {
	char *dir;               /* where files are written: the dataset's directory, or a staging one */
	char *remote;            /* s3://bucket/prefix: each file goes there when finished, then leaves dir */
	char *staging;           /* that staging directory, removed at the end */
	/*
	 * An overwrite (sluice_writer_open_overwrite): dir is a directory of
	 * ours beside the target, swapped with it at close.  target is the
	 * dataset's directory as named (every message names it), canon its
	 * absolute path, in which the swap is made.
	 */
	char *target, *canon;
	mode_t mode;             /* the old dataset directory's permissions, given to the new one at the swap (0: none) */
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	char names[SLUICE_MAX_FIELDS][256];
	size_t fixed[SLUICE_MAX_FIELDS];
	unsigned nfields;
	uint64_t shard_size;
	int fd;                  /* current shard (temporary name), -1 if none */
	int dfd;                 /* the same file opened O_DIRECT, -1 if refused */
	uint64_t file_off;       /* where the next shard bytes go */
	int efd;                 /* entries side file */
	unsigned shard;          /* current shard number */
	uint64_t shard_recs, shard_data;
	uint64_t *shard_records, *shard_bytes;
	unsigned cap;
	uint64_t nrecords;
	uint32_t *group_crc;     /* the CRC of each group of SL_EGROUP entries so far (the last one growing) */
	char *meta;              /* the metadata to store (options.metadata, copied), or NULL */
	size_t group_cap;
	unsigned char *buf;      /* shard write buffer */
	size_t buf_len;
	unsigned char *ebuf;     /* entries write buffer */
	size_t ebuf_len;
	unsigned char *rec;      /* one encoded record */
	size_t rec_cap;
	unsigned char *json;     /* values of one JSON line */
	size_t json_cap;
	/* zstd blocks (zstd_level > 0): records gather in blk until block_size. */
	int zstd_level;
	size_t block_size;
	ZSTD_CCtx *cctx;
	unsigned char *blk, *zbuf;
	size_t blk_len, blk_cap, zcap;
	uint64_t blk_start;      /* logical offset of blk's first byte */
	struct sl__block *blocks; /* of the current shard */
	uint64_t nblocks, blocks_cap;
};

static char *sl_path(const char *dir, const char *fmt, unsigned n)
{
	char *p = NULL, name[64];

	snprintf(name, sizeof(name), fmt, n);
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

/* Writes all of p at off (off < 0: at the file position). */
static int sl_write_at(int fd, const void *p, size_t n, int64_t off, const char *what)
{
	const char *c = p;

	while (n) {
		ssize_t r = off < 0 ? write(fd, c, n) : pwrite(fd, c, n, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return sl__err(r < 0 ? -errno : -EIO, "writing %s: %s", what, strerror(r < 0 ? errno : EIO));
		c += r;
		n -= (size_t)r;
		if (off >= 0)
			off += r;
	}
	return 0;
}

static int sl_write_all(int fd, const void *p, size_t n, const char *what)
{
	return sl_write_at(fd, p, n, -1, what);
}

/*
 * Writes the shard buffer at the shard's end.  The buffer always starts at
 * a 4 KiB-aligned file offset, so its whole blocks can go through O_DIRECT:
 * packing writes each byte once and never reads it back, and copying it
 * into the page cache only costs CPU.  A partial last block stays in the
 * buffer (moved to its start) until more bytes complete it, or, with
 * final set (the shard is done), is written through the page cache.
 */
/* What a failed write was writing, for its error: the part and the dataset's directory. */
static const char *sl_what(const struct sluice_writer *w, const char *part, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s of the dataset %s", part, w->remote ? w->remote : w->target ? w->target : w->dir);
	return buf;
}

static int sl_flush(struct sluice_writer *w, int final)
{
	char what[4200];
	size_t direct = w->dfd >= 0 ? w->buf_len & ~(size_t)(SL_ALIGN - 1) : 0, tail = w->buf_len - direct;
	int rc = 0;

	assert(w->file_off % SL_ALIGN == 0 || w->dfd < 0);
	if (direct)
		rc = sl_write_at(w->dfd, w->buf, direct, (int64_t)w->file_off, sl_what(w, "a shard", what, sizeof(what)));
	if (!rc && tail && (final || w->dfd < 0)) {
		rc = sl_write_at(w->fd, w->buf + direct, tail, (int64_t)(w->file_off + direct),
				 sl_what(w, "a shard", what, sizeof(what)));
		direct += tail;
		tail = 0;
	}
	if (tail)
		memmove(w->buf, w->buf + direct, tail);
	w->file_off += direct;
	w->buf_len = tail;
	return rc;
}

/* Appends n bytes to the shard through the buffer. */
static int sl_append(struct sluice_writer *w, const unsigned char *p, size_t n)
{
	while (n) {
		size_t k = SL_WBUF - w->buf_len < n ? SL_WBUF - w->buf_len : n;
		int rc;

		memcpy(w->buf + w->buf_len, p, k);
		w->buf_len += k;
		p += k;
		n -= k;
		if (w->buf_len == SL_WBUF && (rc = sl_flush(w, 0)))
			return rc;
	}
	return 0;
}

/* Compresses the gathered records into one zstd block, padded to 4 KiB, and appends it. */
static int sl_seal_block(struct sluice_writer *w)
{
	size_t z, padded;
	struct sl__block *b;
	int rc;

	if (!w->zstd_level || !w->blk_len)
		return 0;
	if (w->nblocks == w->blocks_cap) {
		uint64_t cap = w->blocks_cap ? 2 * w->blocks_cap : 64;
		struct sl__block *nb = realloc(w->blocks, cap * sizeof(*nb));

		if (!nb)
			return -ENOMEM;
		w->blocks = nb;
		w->blocks_cap = cap;
	}
	padded = sl__align_up(ZSTD_compressBound(w->blk_len), SL_ALIGN);
	if (sl__reserve(&w->zbuf, &w->zcap, padded))
		return -ENOMEM;
	z = ZSTD_compress2(w->cctx, w->zbuf, w->zcap, w->blk, w->blk_len);
	if (ZSTD_isError(z) || z > UINT32_MAX)
		return sl__err(-EIO, "shard %u: zstd: %s", w->shard, ZSTD_isError(z) ? ZSTD_getErrorName(z) : "block too large");
	padded = sl__align_up(z, SL_ALIGN);
	memset(w->zbuf + z, 0, padded - z);
	b = &w->blocks[w->nblocks];
	*b = (struct sl__block){ SL_HDR_SIZE + w->blk_start, w->file_off + w->buf_len, (uint32_t)z, (uint32_t)w->blk_len,
				 sluice_crc32c(0, w->zbuf, z), 1 };
	rc = sl_append(w, w->zbuf, padded);
	if (rc)
		return rc;
	w->nblocks++;
	w->blk_start += w->blk_len;
	w->blk_len = 0;
	return 0;
}

/* Appends the shard's block table and describes it in the header. */
static int sl_block_table(struct sluice_writer *w, struct sl__shard_hdr *sh)
{
	unsigned char e[SL_BLOCK_ENTRY];
	uint32_t crc = 0;
	int rc = 0;

	sh->flags = SL_FLAG_ZSTD | SL_FLAG_BLOCK_CRC;
	sh->table_off = w->file_off + w->buf_len;
	sh->nblocks = w->nblocks;
	for (uint64_t k = 0; !rc && k < w->nblocks; k++) {
		sl__put64(e, w->blocks[k].logical);
		sl__put64(e + 8, w->blocks[k].file);
		sl__put32(e + 16, w->blocks[k].stored);
		sl__put32(e + 20, w->blocks[k].len);
		crc = sluice_crc32c(crc, e, sizeof(e));
		rc = sl_append(w, e, sizeof(e));
	}
	/* Then each block's stored bytes' CRC: what a reader checks before trusting a decoder with them. */
	for (uint64_t k = 0; !rc && k < w->nblocks; k++) {
		sl__put32(e, w->blocks[k].crc);
		crc = sluice_crc32c(crc, e, 4);
		rc = sl_append(w, e, 4);
	}
	sh->table_crc = crc;
	return rc;
}

/* Seals the current shard: header, sync, rename into place. */
/* A finished file of an s3:// dataset: uploaded as remote/NAME, then removed from the staging directory. */
static int sl_send(struct sluice_writer *w, const char *local, const char *fmt, unsigned n)
{
	char *url = sl_path(w->remote, fmt, n);
	int rc = url ? sl__fs_upload(local, url) : -ENOMEM;

	if (!rc)
		unlink(local);
	free(url);
	return rc;
}

static int sl_finish_shard(struct sluice_writer *w)
{
	unsigned char h[SL_HDR_SIZE];
	char *tmp, *fin;
	int rc;

	struct sl__shard_hdr sh = { .shard = w->shard, .nrecords = w->shard_recs, .data_len = w->shard_data };

	if (w->fd < 0)
		return 0;
	rc = sl_seal_block(w);
	if (!rc && w->zstd_level)
		rc = sl_block_table(w, &sh);
	if (!rc)
		rc = sl_flush(w, 1);
	sl__shard_header(h, &sh);
	if (!rc && pwrite(w->fd, h, SL_HDR_SIZE, 0) != SL_HDR_SIZE)
		rc = sl__err(-errno, "writing shard %u header", w->shard);
	if (!rc && fdatasync(w->fd) < 0)
		rc = sl__err(-errno, "syncing shard %u", w->shard);
	close(w->fd);
	if (w->dfd >= 0)
		close(w->dfd);
	w->fd = w->dfd = -1;
	tmp = sl_path(w->dir, ".shard-%06u.sls.tmp", w->shard);
	fin = sl_path(w->dir, "shard-%06u.sls", w->shard);
	if (!rc && (!tmp || !fin))
		rc = -ENOMEM;
	if (!rc && rename(tmp, fin) < 0)
		rc = sl__err(-errno, "%s: rename: %s", fin, strerror(errno));
	if (!rc && w->remote)
		rc = sl_send(w, fin, "shard-%06u.sls", w->shard);
	free(tmp);
	free(fin);
	if (rc)
		return rc;
	if (w->shard >= w->cap) {
		unsigned cap = w->cap ? 2 * w->cap : 64;
		uint64_t *a = realloc(w->shard_records, cap * sizeof(uint64_t));
		uint64_t *b = a ? realloc(w->shard_bytes, cap * sizeof(uint64_t)) : NULL;

		if (a)
			w->shard_records = a;
		if (!a || !b)
			return -ENOMEM;
		w->shard_bytes = b;
		w->cap = cap;
	}
	w->shard_records[w->shard] = w->shard_recs;
	w->shard_bytes[w->shard] = w->shard_data;
	w->shard++;
	return 0;
}

static int sl_start_shard(struct sluice_writer *w)
{
	char *tmp;
	unsigned char zero[SL_HDR_SIZE] = { 0 };
	int rc;

	if (w->shard >= SL_MAX_SHARDS)
		return sl__err(-EFBIG, "%s: more than %u shards; raise the shard size", w->dir, SL_MAX_SHARDS);
	/* The shard is renamed over its name when sealed: refuse now a name held by a directory, FIFO or device. */
	if (!(tmp = sl_path(w->dir, "shard-%06u.sls", w->shard)))
		return -ENOMEM;
	rc = sl__replaceable(tmp);
	free(tmp);
	if (rc)
		return rc;
	tmp = sl_path(w->dir, ".shard-%06u.sls.tmp", w->shard);
	if (!tmp)
		return -ENOMEM;
	w->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0) {
		int e = errno;

		free(tmp);
		return sl__err(-e, "%s/.shard-%06u.sls.tmp: %s", w->dir, w->shard, strerror(e));
	}
	w->dfd = open(tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
	free(tmp);
	w->shard_recs = 0;
	w->shard_data = 0;
	w->file_off = SL_HDR_SIZE;
	w->nblocks = 0;
	w->blk_start = 0;
	/* The header is rewritten at the end; reserve its 4 KiB now. */
	return sl_write_at(w->fd, zero, sizeof(zero), 0, "a shard header");
}

/*
 * Overwrites.  The new dataset is written into ".NAME.sluice-new-HOST-PID-N"
 * beside the target NAME, in the same directory (so one file system), and
 * at close, once its index is synced, renameat2(RENAME_EXCHANGE) swaps the
 * two directories in one step: before it the path holds the old dataset
 * whole, after it the new one whole, and never nothing (rename(2) alone
 * cannot replace a directory that is not empty).  The old one, now under
 * the staging name, is then removed.  A writer killed before the swap
 * leaves its staging directory, one killed after it the old dataset there:
 * the next overwrite of the same target on this host removes those whose
 * writer is gone, as durable writes reclaim their temporaries.
 */

/* Whether name is one a sluice writer makes in a dataset's directory (the dataset's, or a killed writer's). */
static int sl_own_name(const char *name)
{
	const char *d = NULL;
	size_t n;

	if (!strcmp(name, SL_INDEX_NAME) || !strcmp(name, SL_INDEX_NAME ".tmp") || !strcmp(name, ".entries.tmp"))
		return 1;
	if (!strncmp(name, "shard-", 6))
		d = name + 6;
	else if (!strncmp(name, ".shard-", 7))
		d = name + 7;
	if (!d || (n = strspn(d, "0123456789")) < 6 || n > 10)
		return 0;
	return !strcmp(d + n, d == name + 6 ? ".sls" : ".sls.tmp");
}

/*
 * Whether an overwrite may replace the directory dir: it holds only the
 * regular files a sluice writer makes (a dataset, or what an unfinished
 * write left), or nothing.  Else an error naming the first entry that is
 * not one (a user's directory of other files is never removed).
 */
static int sl_replaceable_dir(const char *dir, const char *shown)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int rc = 0;

	if (!d)
		return sl__err(-errno, "%s: %s", shown, strerror(errno));
	while (!rc && (e = readdir(d))) {
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (!sl_own_name(e->d_name))
			rc = sl__err(-ENOTEMPTY, "%s holds '%s', which is no sluice dataset's: not replaced (an overwrite "
				     "replaces a sluice dataset, what an unfinished pack left, or an empty directory)",
				     shown, e->d_name);
		else if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			rc = sl__err(-errno, "%s/%s: %s", shown, e->d_name, strerror(errno));
		else if (!S_ISREG(st.st_mode))
			rc = sl__err(-ENOTEMPTY, "%s/%s is a %s, not a sluice dataset's file: not replaced", shown,
				     e->d_name, sl__file_kind(st.st_mode));
	}
	closedir(d);
	return rc;
}

/* Removes a directory of sluice's files (sl_replaceable_dir's kind), then the directory; 0 or -errno. */
static int sl_remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while ((e = readdir(d)))
		if (sl_own_name(e->d_name))
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	return rmdir(dir) < 0 ? -errno : 0;
}

/* The prefix of base's staging directories made on this host, ".BASE.sluice-new-HOST-" (base cut to 100 bytes). */
static void sl_stage_prefix(char *buf, size_t cap, const char *base)
{
	char host[64] = "host";

	gethostname(host, sizeof(host) - 1);
	for (char *h = host; *h; h++)
		if (*h == '/' || *h == '-')
			*h = '_';
	snprintf(buf, cap, ".%.100s.sluice-new-%s-", base, host);
}

/* Removes the staging directories of base in parent whose writer (a process of this host) is gone. */
static void sl_reclaim_stages(const char *parent, const char *base)
{
	char prefix[256];
	size_t pl;
	DIR *d = opendir(parent);
	struct dirent *e;

	sl_stage_prefix(prefix, sizeof(prefix), base);
	pl = strlen(prefix);
	while (d && (e = readdir(d))) {
		char *end, p[PATH_MAX + 256];
		long pid;
		int rc;

		if (strncmp(e->d_name, prefix, pl) || (pid = strtol(e->d_name + pl, &end, 10)) <= 0 || *end != '-' ||
		    !(kill((pid_t)pid, 0) < 0 && errno == ESRCH))
			continue;
		snprintf(p, sizeof(p), "%s/%s", parent, e->d_name);
		if ((rc = sl_remove_dir(p)))
			sl__warn("format", "%s: left by a writer that is gone (process %ld), not removed: %s", p, pid,
				 strerror(-rc));
		else
			sl__info("format", "%s: removed, its writer (process %ld) is gone", p, pid);
	}
	if (d)
		closedir(d);
}

/* Makes a staging directory of base in parent; its path in *out. */
static int sl_make_stage(const char *parent, const char *base, char **out)
{
	static _Atomic unsigned seq;
	char prefix[256];

	sl_stage_prefix(prefix, sizeof(prefix), base);
	for (int tries = 0; tries < 100; tries++) {
		if (asprintf(out, "%s/%s%d-%u", parent, prefix, (int)getpid(), atomic_fetch_add(&seq, 1)) < 0)
			return *out = NULL, -ENOMEM;
		if (mkdir(*out, 0777) == 0)
			return 0;
		free(*out);
		*out = NULL;
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

/*
 * Whether this file system swaps two directories in one rename: two empty
 * directories of ours are swapped, then removed.  Asked before anything
 * is written, so a pack does not run for an hour to fail at its end.
 */
static int sl_can_exchange(const char *parent, const char *base, const char *stage, const char *shown)
{
	char *probe = NULL;
	int rc = sl_make_stage(parent, base, &probe), e = 0;

	if (!rc && renameat2(AT_FDCWD, stage, AT_FDCWD, probe, RENAME_EXCHANGE) < 0)
		e = errno;
	if (probe) {
		rmdir(probe);
		free(probe);
	}
	if (rc)
		return sl__err(rc, "%s: cannot make a directory beside it: %s", shown, strerror(-rc));
	if (e == EINVAL || e == ENOSYS || e == EOPNOTSUPP)
		return sl__err(-EOPNOTSUPP, "%s: its file system cannot swap two directories in one rename "
			       "(renameat2 RENAME_EXCHANGE: %s), so an overwrite would leave nothing there for a moment: "
			       "remove it first, or write the new dataset elsewhere", shown, strerror(e));
	return e ? sl__err(-e, "%s: renameat2 beside it: %s", shown, strerror(e)) : 0;
}

/*
 * An overwrite's checks and staging directory: the target must be absent,
 * or a directory sl_replaceable_dir accepts (through a link: the link is
 * kept, what it names replaced), on the file system of its parent (not a
 * mount point); the file system must swap directories.  Leaves w->dir
 * the staging directory, w->target and w->canon set.
 */
static int sl_writer_stage(struct sluice_writer *w, const char *dir)
{
	char *t = strdup(dir), *copy = NULL, *parent = NULL, *base;
	struct stat st, pst;
	int rc = 0, exists;

	if (!t)
		return -ENOMEM;
	sl__trim_slashes(t);
	exists = stat(t, &st) == 0;
	if (!exists && errno != ENOENT) {
		rc = sl__err(-errno, "%s: %s", dir, strerror(errno));
	} else if (!exists && lstat(t, &st) == 0) {
		rc = sl__err(-ENOENT, "%s is a link to nothing: not replaced", dir);
	} else if (exists && !S_ISDIR(st.st_mode)) {
		rc = sl__err(-ENOTDIR, "%s is a %s, not a sluice dataset: not replaced", dir, sl__file_kind(st.st_mode));
	} else if (exists) {
		rc = sl_replaceable_dir(t, dir);
		if (!rc && !(w->canon = realpath(t, NULL)))
			rc = sl__err(-errno, "%s: %s", dir, strerror(errno));
	} else if (!(copy = strdup(t)) || !(parent = strdup(dirname(copy)))) {
		rc = -ENOMEM;
	} else if ((rc = sl__mkdirs(parent))) {
		rc = sl__err(rc, "%s: cannot create: %s", parent, strerror(-rc));
	} else {
		char *p = realpath(parent, NULL), *b = basename(t);

		if (!p || asprintf(&w->canon, "%s/%s", strcmp(p, "/") ? p : "", b) < 0)
			rc = sl__err(p ? -ENOMEM : -errno, "%s: %s", parent, strerror(p ? ENOMEM : errno));
		free(p);
	}
	free(copy);
	free(parent);
	free(t);
	copy = parent = NULL;
	if (!rc && (!(copy = strdup(w->canon)) || !(parent = strdup(dirname(copy)))))
		rc = -ENOMEM;
	base = w->canon ? strrchr(w->canon, '/') + 1 : NULL;
	if (!rc && (!*base || !strcmp(w->canon, "/")))
		rc = sl__err(-EINVAL, "%s: not a directory an overwrite can replace", dir);
	if (!rc && exists && (stat(parent, &pst) < 0 || pst.st_dev != st.st_dev))
		rc = sl__err(-EXDEV, "%s is a mount point (or its parent cannot be read): the new dataset cannot be "
			     "made beside it to replace it in one rename", dir);
	if (!rc && !(w->target = strdup(dir)))
		rc = -ENOMEM;
	if (!rc) {
		sl_reclaim_stages(parent, base);
		w->mode = exists ? st.st_mode & 07777 : 0;
		if ((rc = sl_make_stage(parent, base, &w->dir)))
			rc = sl__err(rc, "%s: cannot make a directory beside it: %s", dir, strerror(-rc));
	}
	if (!rc && exists)
		rc = sl_can_exchange(parent, base, w->dir, dir);
	free(copy);
	free(parent);
	return rc;
}

/*
 * At close, the staging directory (a whole dataset, synced) takes the
 * target's place: swapped with the old dataset, whose files are then
 * removed, or renamed to the name where there is none; then the parent
 * synced.  The target is checked again first: it may have changed since
 * open.  Returns 0 once the new dataset is in place.
 */
static int sl_writer_swap(struct sluice_writer *w)
{
	char *copy = strdup(w->canon), *parent = copy ? dirname(copy) : NULL;
	int rc = copy ? 0 : -ENOMEM, swapped = 0, pfd;

	/* The old directory's permissions, now that the new one is written (a read-only one would refuse its files). */
	if (!rc && w->mode && chmod(w->dir, w->mode) < 0)
		rc = sl__err(-errno, "%s: chmod: %s", w->dir, strerror(errno));
	for (int tries = 0; !rc && tries < 2; tries++) {
		struct stat st;

		if (lstat(w->canon, &st) == 0) {
			if (!S_ISDIR(st.st_mode))
				rc = sl__err(-ENOTDIR, "%s became a %s while the dataset was written: not replaced", w->target,
					     sl__file_kind(st.st_mode));
			else if (!(rc = sl_replaceable_dir(w->canon, w->target)) &&
				 renameat2(AT_FDCWD, w->dir, AT_FDCWD, w->canon, RENAME_EXCHANGE) < 0)
				rc = sl__err(-errno, "%s: swapping in the new dataset: %s", w->target, strerror(errno));
			swapped = !rc;
			break;
		}
		if (renameat2(AT_FDCWD, w->dir, AT_FDCWD, w->canon, RENAME_NOREPLACE) == 0 ||
		    (errno == EINVAL && rename(w->dir, w->canon) == 0))
			break;
		if (errno != EEXIST) /* EEXIST: made meanwhile, swapped the next time round */
			rc = sl__err(-errno, "%s: renaming the new dataset into place: %s", w->target, strerror(errno));
	}
	if (!rc) {
		pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pfd < 0 || fsync(pfd) < 0)
			sl__warn("format", "%s: fsync: %s", parent, strerror(errno));
		if (pfd >= 0)
			close(pfd);
	}
	if (swapped) {
		int e = sl_remove_dir(w->dir);

		if (e)
			sl__warn("format", "%s: the dataset %s replaced, not removed: %s", w->dir, w->target, strerror(-e));
	}
	free(copy);
	return rc;
}

/*
 * What must hold before anything is made: a valid schema and metadata, dir
 * made, and no dataset there yet (an overwrite's target is checked by
 * sl_writer_stage instead).
 */
static int sl_writer_check(const char *dir, const struct sluice_field *fields, unsigned nfields,
			   const struct sluice_writer_options *opt, int overwrite)
{
	struct stat st;
	char *p;
	int rc = sl__schema_check(fields, nfields), e;

	if (!rc && opt && opt->metadata) {
		json_error_t je;
		json_t *j = strlen(opt->metadata) <= SL_META_MAX ? json_loads(opt->metadata, 0, &je) : NULL;
		int obj = json_is_object(j);

		json_decref(j);
		if (!obj)
			rc = sl__err(SLUICE_EINVAL_CONFIG, "%s: the metadata is not a JSON object of at most %u bytes", dir,
				     SL_META_MAX);
	}
	if (rc || overwrite)
		return rc;
	/* The directory and its missing parents, as mkdir -p. */
	if (sl__fs_is_local(dir)) {
		char *d = strdup(dir);

		e = d ? sl__mkdirs(d) : -ENOMEM;
		free(d);
		if (e)
			rc = sl__err(e, "%s: cannot create: %s", dir, strerror(-e));
	}
	if (rc)
		return rc;
	if (asprintf(&p, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", SL_INDEX_NAME) < 0)
		return -ENOMEM;
	e = sl__fs_stat(p, &st);
	rc = !e ? sl__err(-EEXIST, "%s already holds a dataset (%s); an overwrite replaces it (sluice pack --overwrite, "
			  "sluice.pack(overwrite=True))", dir, SL_INDEX_NAME)
		: e != -ENOENT ? e : 0; /* the store's error names p */
	free(p);
	return rc;
}

/*
 * Where the files are made: dir itself; for an overwrite a directory
 * beside it; for a remote store a staging directory whose files go up when
 * finished.
 */
static int sl_writer_place(struct sluice_writer *w, const char *dir, int overwrite)
{
	char stage[4096];
	int rc;

	if (overwrite && !sl__fs_is_local(dir))
		return sl__err(-EOPNOTSUPP, "%s: an overwrite replaces a local dataset only: a store's objects cannot "
			       "all be replaced at once, so a reader could see a mix; remove it first (sluice.remove), or "
			       "write to a new prefix", dir);
	if (overwrite)
		return sl_writer_stage(w, dir);
	if (sl__fs_is_local(dir))
		return (w->dir = strdup(dir)) ? 0 : -ENOMEM;
	if ((rc = sl__fs_staging(stage, sizeof(stage))))
		return rc;
	w->remote = strdup(dir);
	sl__trim_slashes(w->remote);
	w->dir = strdup(stage);
	w->staging = strdup(stage);
	return w->remote && w->dir && w->staging ? 0 : -ENOMEM;
}

/* zstd shards: the level and block size checked, the compression context made. */
static int sl_writer_zstd(struct sluice_writer *w, const struct sluice_writer_options *opt)
{
	if (opt->zstd_level < 1 || opt->zstd_level > ZSTD_maxCLevel())
		return sl__err(SLUICE_EINVAL_CONFIG, "zstd level %d out of range (1..%d)", opt->zstd_level,
			       ZSTD_maxCLevel());
	if (opt->block_size && (opt->block_size < SL_MIN_BLOCK || opt->block_size > (1u << 30)))
		return sl__err(SLUICE_EINVAL_CONFIG, "zstd block size %zu bytes out of range (1 MiB..1 GiB; 0: 1 MiB)",
			       opt->block_size);
	w->zstd_level = opt->zstd_level;
	w->block_size = opt->block_size ? opt->block_size : 1u << 20; /* GPU decoders want many blocks; a shuffle run spans fewer (BENCHMARKS) */
	w->cctx = ZSTD_createCCtx();
	if (!w->cctx || ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, w->zstd_level)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1)))
		return -ENOMEM;
	return 0;
}

static int sl_writer_open(struct sluice_writer **out, const char *dir, const struct sluice_field *fields,
			  unsigned nfields, const struct sluice_writer_options *opt, int overwrite)
{
	struct sluice_writer_options o;
	struct sluice_writer *w;
	char *p;
	int rc;

	*out = NULL;
	sl__err_clear();
	if ((rc = SL_SIZED_IN(&o, opt, writer_options)))
		return rc;
	opt = &o;
	if ((rc = sl_writer_check(dir, fields, nfields, opt, overwrite)))
		return rc;
	if (!(w = calloc(1, sizeof(*w))))
		return -ENOMEM;
	w->fd = w->dfd = w->efd = -1;
	if ((rc = sl_writer_place(w, dir, overwrite)))
		goto fail;
	if (posix_memalign((void **)&w->buf, SL_ALIGN, SL_WBUF)) /* O_DIRECT source */
		w->buf = NULL;
	w->ebuf = malloc(SL_WBUF);
	if (!w->buf || !w->ebuf || (opt && opt->metadata && !(w->meta = strdup(opt->metadata)))) {
		rc = -ENOMEM;
		goto fail;
	}
	w->nfields = nfields;
	for (unsigned i = 0; i < nfields; i++) {
		w->fields[i] = fields[i];
		snprintf(w->names[i], sizeof(w->names[i]), "%s", fields[i].name);
		w->fields[i].name = w->names[i];
		w->fixed[i] = sl__field_fixed_size(&fields[i]);
	}
	if (opt && opt->zstd_level && (rc = sl_writer_zstd(w, opt)))
		goto fail;
	w->shard_size = opt && opt->shard_size ? opt->shard_size : 1ull << 30;
	if (w->shard_size > SL_MAX_SHARD_BYTES)
		w->shard_size = SL_MAX_SHARD_BYTES;
	p = sl_path(w->dir, ".entries.tmp", 0);
	w->efd = p ? open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
	if (w->efd < 0) {
		rc = sl__err(p ? -errno : -ENOMEM, "%s/.entries.tmp: cannot create", w->dir);
		free(p);
		goto fail;
	}
	free(p);
	*out = w;
	return 0;
fail:
	sluice_writer_abort(w);
	return rc;
}

int sluice_writer_open(struct sluice_writer **out, const char *dir, const struct sluice_field *fields,
		       unsigned nfields, const struct sluice_writer_options *opt)
{
	return sl_writer_open(out, dir, fields, nfields, opt, 0);
}

int sluice_writer_open_overwrite(struct sluice_writer **out, const char *dir, const struct sluice_field *fields,
				 unsigned nfields, const struct sluice_writer_options *opt)
{
	return sl_writer_open(out, dir, fields, nfields, opt, 1);
}

uint64_t sluice_writer_count(const struct sluice_writer *w)
{
	return w->nrecords;
}

/* Adds a record's bytes to the block being gathered; a full block is sealed. */
static int sl_gather(struct sluice_writer *w, const unsigned char *p, size_t n)
{
	if (w->blk_len + n > w->blk_cap &&
	    sl__reserve(&w->blk, &w->blk_cap, w->blk_len + n > w->block_size ? w->blk_len + n : w->block_size))
		return -ENOMEM;
	memcpy(w->blk + w->blk_len, p, n);
	w->blk_len += n;
	return w->blk_len >= w->block_size ? sl_seal_block(w) : 0;
}

int sluice_writer_add(struct sluice_writer *w, const void *const *vals, const size_t *lens)
{
	size_t n;
	unsigned char e[SL_ENTRY];
	char what[4200];
	int rc;

	for (unsigned i = 0; i < w->nfields; i++) {
		size_t es = sluice_dtype_size(w->fields[i].dtype);

		if ((w->fixed[i] && lens[i] != w->fixed[i]) || lens[i] % es || lens[i] > UINT32_MAX ||
		    (!vals[i] && lens[i]))
			return sl__err(SLUICE_EINVAL_CONFIG, "record %llu, field '%s': %zu bytes is not a valid %s value%s",
				       (unsigned long long)w->nrecords, w->fields[i].name, lens[i],
				       sluice_dtype_name(w->fields[i].dtype), w->fixed[i] ? " of its fixed shape" : "");
	}
	n = sl__record_size(w->nfields, lens);
	if (n > UINT32_MAX)
		return sl__err(SLUICE_EINVAL_CONFIG, "record %llu: %zu bytes, more than 4 GiB",
			       (unsigned long long)w->nrecords, n);
	/* A shard closes at its target size, and before its offsets outgrow the entry. */
	if (w->fd >= 0 && w->shard_recs && (w->shard_data + n > w->shard_size || w->shard_data + n > SL_MAX_SHARD_BYTES)) {
		rc = sl_finish_shard(w);
		if (rc)
			return rc;
	}
	if (w->fd < 0 && (rc = sl_start_shard(w)))
		return rc;
	if (sl__reserve(&w->rec, &w->rec_cap, n))
		return -ENOMEM;
	sl__record_encode(w->rec, w->nfields, vals, lens);
	/* Records start 8-byte aligned, so the offset is kept in 8-byte units. */
	sl__put32(e, (uint32_t)((SL_HDR_SIZE + w->shard_data) / 8));
	sl__put32(e + 4, (uint32_t)n);
	sl__put32(e + 8, sluice_crc32c(0, w->rec, n));
	rc = w->zstd_level ? sl_gather(w, w->rec, n) : sl_append(w, w->rec, n);
	if (rc)
		return rc;
	if (w->ebuf_len + SL_ENTRY > SL_WBUF) {
		rc = sl_write_all(w->efd, w->ebuf, w->ebuf_len, sl_what(w, "the entries", what, sizeof(what)));
		if (rc)
			return rc;
		w->ebuf_len = 0;
	}
	if (w->nrecords % SL_EGROUP == 0 &&
	    sl__reserve(&w->group_crc, &w->group_cap, (w->nrecords / SL_EGROUP + 1) * sizeof(uint32_t)))
		return -ENOMEM;
	w->group_crc[w->nrecords / SL_EGROUP] =
		sluice_crc32c(w->nrecords % SL_EGROUP ? w->group_crc[w->nrecords / SL_EGROUP] : 0, e, SL_ENTRY);
	memcpy(w->ebuf + w->ebuf_len, e, SL_ENTRY);
	w->ebuf_len += SL_ENTRY;
	w->shard_data += n;
	w->shard_recs++;
	w->nrecords++;
	return 0;
}

int sl__writer_add_json(struct sluice_writer *w, const char *line, size_t len, const char *from, uint64_t lineno)
{
	const void *vals[SLUICE_MAX_FIELDS];
	size_t lens[SLUICE_MAX_FIELDS];
	int rc = sl__json_values(w->fields, w->nfields, line, len, &w->json, &w->json_cap, vals, lens);

	if (rc)
		return sl__err(rc, "%s:%llu: record %llu: %s", from, (unsigned long long)lineno,
			       (unsigned long long)w->nrecords, sluice_last_error_detail());
	return sluice_writer_add(w, vals, lens);
}

int sluice_writer_close(struct sluice_writer *w)
{
	unsigned char *hdr = NULL;
	size_t hlen;
	char *tmp = NULL, *fin = NULL, *ent = NULL, what[4200];
	int rc, ifd = -1, dfd;

	/* An empty dataset still has one (empty) shard, so every index names >= 1. */
	if (w->fd < 0 && w->shard == 0 && (rc = sl_start_shard(w)))
		goto out;
	rc = sl_finish_shard(w);
	if (!rc && w->ebuf_len)
		rc = sl_write_all(w->efd, w->ebuf, w->ebuf_len, sl_what(w, "the entries", what, sizeof(what)));
	if (rc)
		goto out;
	rc = sl__index_build(w->fields, w->nfields, w->nrecords, w->group_crc, w->meta, w->shard_records, w->shard_bytes,
			     w->shard,
			     w->zstd_level ? SL_FLAG_ZSTD : 0, &hdr, &hlen);
	if (rc)
		goto out;
	tmp = sl_path(w->dir, SL_INDEX_NAME ".tmp", 0);
	fin = sl_path(w->dir, SL_INDEX_NAME, 0);
	ent = sl_path(w->dir, ".entries.tmp", 0);
	if (!tmp || !fin || !ent) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = sl__replaceable(fin)))
		goto out;
	ifd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (ifd < 0) {
		rc = sl__err(-errno, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	rc = sl_write_all(ifd, hdr, hlen, sl_what(w, "the index", what, sizeof(what)));
	/* Append the entries (kernel-side copy). */
	for (loff_t off = 0; !rc && off < (loff_t)(SL_ENTRY * w->nrecords);) {
		ssize_t r = copy_file_range(w->efd, &off, ifd, NULL, (size_t)(SL_ENTRY * w->nrecords - (uint64_t)off), 0);

		if (r <= 0)
			rc = sl__err(r < 0 ? -errno : -EIO, "copying entries into %s", tmp);
	}
	if (!rc && fdatasync(ifd) < 0)
		rc = sl__err(-errno, "syncing %s", tmp);
	if (!rc && rename(tmp, fin) < 0)
		rc = sl__err(-errno, "%s: rename: %s", fin, strerror(errno));
	/* The index last: readers find a dataset only once every shard is there. */
	if (!rc && w->remote && (rc = sl_send(w, fin, SL_INDEX_NAME, 0)))
		unlink(fin);
	if (!rc) {
		unlink(ent);
		dfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 || fsync(dfd) < 0)
			rc = sl__err(-errno, "%s: fsync: %s", w->dir, strerror(errno));
		if (dfd >= 0)
			close(dfd);
	}
	/* An overwrite: the whole new dataset, synced, takes the old one's place in one rename. */
	if (!rc && w->target)
		rc = sl_writer_swap(w);
out:
	if (ifd >= 0)
		close(ifd);
	if (rc && tmp)
		unlink(tmp);
	free(hdr);
	free(tmp);
	free(fin);
	free(ent);
	if (rc) {
		sluice_writer_abort(w);
		return rc;
	}
	close(w->efd);
	w->efd = -1;
	free(w->dir);
	w->dir = NULL;
	sluice_writer_abort(w);
	return 0;
}

void sluice_writer_abort(struct sluice_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0)
		close(w->fd);
	if (w->dfd >= 0)
		close(w->dfd);
	if (w->efd >= 0)
		close(w->efd);
	if (w->dir) {
		/*
		 * Remove what this writer made: shards so far, temporaries.  The
		 * current shard's name may hold what it refused to replace (a
		 * FIFO, a directory): only a regular file there is its own.
		 */
		for (unsigned s = 0; s <= w->shard; s++) {
			char *a = sl_path(w->dir, "shard-%06u.sls", s), *b = sl_path(w->dir, ".shard-%06u.sls.tmp", s);
			struct stat st;

			if (a && (s < w->shard || (lstat(a, &st) == 0 && S_ISREG(st.st_mode))))
				unlink(a);
			if (b)
				unlink(b);
			free(a);
			free(b);
		}
		char *e = sl_path(w->dir, ".entries.tmp", 0), *t = sl_path(w->dir, SL_INDEX_NAME ".tmp", 0);

		if (e)
			unlink(e);
		if (t)
			unlink(t);
		free(e);
		free(t);
		if (w->target) /* an overwrite's directory of its own (its index too, if the swap failed), beside the old */
			sl_remove_dir(w->dir);
	}
	if (w->remote) {
		/* Shards already sent go too (a closed writer's stay: its index is there). */
		for (unsigned s = 0; w->dir && s < w->shard; s++) {
			char *u = sl_path(w->remote, "shard-%06u.sls", s);

			if (u && sl__fs_remove(u))
				sl__warn("format", "%s: not removed: %s", u, sluice_last_error_detail());
			free(u);
		}
		if (w->staging)
			rmdir(w->staging);
		free(w->staging);
		free(w->remote);
	}
	free(w->dir);
	free(w->target);
	free(w->canon);
	free(w->buf);
	free(w->ebuf);
	free(w->rec);
	free(w->json);
	free(w->shard_records);
	free(w->shard_bytes);
	free(w->group_crc);
	free(w->meta);
	ZSTD_freeCCtx(w->cctx);
	free(w->blk);
	free(w->zbuf);
	free(w->blocks);
	free(w);
}
