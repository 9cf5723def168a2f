/*
 * The local cache of remote files (names.h).  DIR/<h>.data is the copy of
 * one version of a file, DIR/<h>.meta says what it is a copy of (store,
 * endpoint, the path with its credentials hidden, size, version tag) and
 * which file on disk it was written as (inode and ctime), and its
 * modification time is the last use; DIR/<h>.lock is the copy's lock; h
 * hashes the store, its endpoint, the whole path and the version, so a
 * new version is a new copy and a copy never changes under its readers (a
 * file that gives no version is a new copy at each fetch).  Copies and
 * their .meta are the user's alone (0600).
 * A copy is renamed into place whole and its .meta written after it, so a
 * crash leaves at worst a copy whose .meta does not match: it is
 * downloaded again.  DIR/<h>.part.PID is a download in progress; one whose
 * process is gone is removed by the next eviction pass.
 *
 * A copy is checked on the way in (the store's fetch matches the file's
 * checksum where it has one) and on reuse: a copy whose inode or ctime
 * changed since it was written (something wrote into it) is downloaded
 * again, as is one of a file whose store gives no version tag.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "store/names.h"
#include "store/store.h"

struct sl_cache {
	char dir[3072];
	uint64_t limit;
};

/* This process's object-cache lookups: copies found good, and objects downloaded (sluice.h). */
static _Atomic uint64_t sl_hits, sl_misses;

void sluice_object_cache_counts(uint64_t *hits, uint64_t *misses)
{
	*hits = atomic_load(&sl_hits);
	*misses = atomic_load(&sl_misses);
}

static int sl_cache_conf(struct sl_cache *c)
{
	const char *d = sl__setting("SLUICE_CACHE_DIR");
	struct statvfs vfs;
	int rc;

	if (d && *d)
		snprintf(c->dir, sizeof(c->dir), "%s", d);
	else if ((d = getenv("XDG_CACHE_HOME")) && *d)
		snprintf(c->dir, sizeof(c->dir), "%s/sluice", d);
	else if ((d = getenv("HOME")) && *d)
		snprintf(c->dir, sizeof(c->dir), "%s/.cache/sluice", d);
	else
		return sl__err(SLUICE_EINVAL_CONFIG, "no cache directory for remote datasets: set SLUICE_CACHE_DIR");
	if ((rc = sl__mkdirs(c->dir)))
		return sl__err(rc, "SLUICE_CACHE_DIR %s: %s", c->dir, strerror(-rc));
	if ((rc = sl__setting_u64("SLUICE_CACHE_LIMIT", &c->limit)) < 0)
		return rc;
	if (rc == 0) {
	} else if (statvfs(c->dir, &vfs) == 0) {
		c->limit = (uint64_t)vfs.f_blocks * vfs.f_frsize / 2;
	} else {
		return sl__err(-errno, "SLUICE_CACHE_DIR %s: %s", c->dir, strerror(errno));
	}
	return 0;
}

/* 128 bits of FNV-1a over the store, its endpoint, the path and the version, as hex. */
static void sl_cache_name(const char *const key[4], char out[33])
{
	uint64_t h[2] = { 0xcbf29ce484222325ull, 0x6c62272e07bb0142ull };

	for (int k = 0; k < 2; k++)
		for (int i = 0; i < 4; i++) {
			for (const char *s = key[i]; *s; s++)
				h[k] = (h[k] ^ (unsigned char)*s) * 0x100000001b3ull;
			h[k] = (h[k] ^ '\n') * 0x100000001b3ull;
		}
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

/* The .meta's first line: the version of its layout (older .meta files read as no copy). */
#define SL_META_HEAD "sluice-cache 3\n"

/* The .meta's text for a copy (st: the copy as written) of e at key (store, endpoint, path): no credential in it. */
static int sl_meta_text(char *out, size_t cap, const char *const key[4], const struct sl__entry *e,
			const struct stat *st)
{
	char shown[4096];

	sluice_url_redact(key[2], shown, sizeof(shown));
	return snprintf(out, cap, SL_META_HEAD "store %s\nendpoint %s\npath %s\nsize %llu\ntag %s\nstamp %llu %llu\n",
			key[0], key[1], shown, (unsigned long long)e->size, e->tag, (unsigned long long)st->st_ino,
			(unsigned long long)st->st_ctim.tv_sec * 1000000000ull + (unsigned long long)st->st_ctim.tv_nsec);
}

struct sl_victim {
	char name[40];
	uint64_t bytes;
	struct timespec used;
};

static int sl_older(const void *a, const void *b)
{
	const struct sl_victim *x = a, *y = b;

	if (x->used.tv_sec != y->used.tv_sec)
		return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
	return (x->used.tv_nsec > y->used.tv_nsec) - (x->used.tv_nsec < y->used.tv_nsec);
}

/* Removes copies, least recently used first, until need more bytes fit; copies in use (locked) stay. */
static int sl_cache_make_room(const struct sl_cache *c, const char *self, uint64_t need, const char *path)
{
	DIR *d = opendir(c->dir);
	struct dirent *e;
	struct sl_victim *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	char p[4096];
	int rc = 0;

	if (!d)
		return sl__err(-errno, "%s: %s", c->dir, strerror(errno));
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		struct stat sd, sm;
		char *end;
		long pid;

		/* Downloads in progress count; those (and .meta temporaries) of processes that are gone are removed. */
		if (l > 38 && (!strncmp(e->d_name + 32, ".part.", 6) || !strncmp(e->d_name + 32, ".meta.", 6)) &&
		    (pid = strtol(e->d_name + 38, &end, 10)) > 0 && !*end) {
			snprintf(p, sizeof(p), "%s/%s", c->dir, e->d_name);
			if (kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
				if (unlink(p) == 0)
					sl__debug("cache", "%s: removed (its process %ld is gone)", p, pid);
			} else if (stat(p, &sd) == 0) {
				total += (uint64_t)sd.st_blocks * 512;
			}
			continue;
		}
		if (l != 37 || strcmp(e->d_name + 32, ".data") || !strncmp(e->d_name, self, 32))
			continue;
		snprintf(p, sizeof(p), "%s/%s", c->dir, e->d_name);
		if (stat(p, &sd) < 0 || sl__reserve(&v, &cap, (n + 1) * sizeof(*v)))
			continue;
		/* Last used: its .meta's time; a copy without one (a download that failed after it) goes first. */
		snprintf(p, sizeof(p), "%s/%.32s.meta", c->dir, e->d_name);
		snprintf(v[n].name, sizeof(v[n].name), "%.32s", e->d_name);
		v[n].bytes = (uint64_t)sd.st_blocks * 512;
		v[n].used = stat(p, &sm) == 0 ? sm.st_mtim : (struct timespec){ 0, 0 };
		total += v[n++].bytes;
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof(*v), sl_older);
	for (size_t i = 0; i < n && total + need > c->limit; i++) {
		int fd;

		snprintf(p, sizeof(p), "%s/%s.lock", c->dir, v[i].name);
		if ((fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0) /* a copy left without one has none */
			continue;
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			static const char *const ext[] = { ".meta", ".data", ".data.idx" };

			for (int k = 0; k < 3; k++) {
				snprintf(p, sizeof(p), "%s/%s%s", c->dir, v[i].name, ext[k]);
				unlink(p);
			}
			total -= v[i].bytes;
			sl__debug("cache", "%s/%s: evicted (%llu bytes)", c->dir, v[i].name,
				  (unsigned long long)v[i].bytes);
		}
		close(fd);
	}
	if (total + need > c->limit)
		rc = sl__err(-ENOSPC, "%s: %s (%llu bytes) does not fit beside the copies in use (%llu bytes) under "
			     "SLUICE_CACHE_LIMIT (%llu bytes)", c->dir, path, (unsigned long long)need,
			     (unsigned long long)total, (unsigned long long)c->limit);
	free(v);
	return rc;
}

/* Writes the .meta at p for the copy at local of e at key. */
static int sl_meta_write(const char *p, const char *local, const char *const key[4], const struct sl__entry *e)
{
	char tmp[4200], *text = malloc(16384);
	struct stat st;
	int fd, n = 0, rc = 0;

	if (!text)
		return -ENOMEM;
	if (stat(local, &st) < 0)
		rc = sl__err(-errno, "%s: %s", local, strerror(errno));
	else if ((n = sl_meta_text(text, 16384, key, e, &st)) >= 16384)
		rc = sl__err(-ENAMETOOLONG, "%s: its path is too long for the cache", key[2]);
	if (rc) {
		free(text);
		return rc;
	}
	snprintf(tmp, sizeof(tmp), "%s.%d", p, (int)getpid());
	errno = 0;
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 ||
	    sl__pio_full(SL_IO_WRITE, fd, text, (size_t)n, 0) != n || close(fd) < 0 || rename(tmp, p) < 0) {
		rc = sl__err(-(errno ? errno : EIO), "%s: %s", p, strerror(errno ? errno : EIO));
		unlink(tmp);
	}
	free(text);
	return rc;
}

/*
 * 1 if the copy at local is of e at key: the .meta at p says so, byte for
 * byte, and the copy is the file written then (same inode and ctime); a
 * file with no version tag is never trusted.
 */
static int sl_copy_good(const char *p, const char *local, const char *const key[4], const struct sl__entry *e)
{
	char *want = malloc(16384), *have = malloc(16384);
	struct stat st;
	int fd = -1, n = 0, ok = 0;

	if (want && have && e->tag[0] && stat(local, &st) == 0 && (uint64_t)st.st_size == e->size &&
	    (n = sl_meta_text(want, 16384, key, e, &st)) < 16384 && (fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) >= 0)
		ok = read(fd, have, 16384) == n && !memcmp(want, have, (size_t)n);
	if (fd >= 0)
		close(fd);
	if (!ok && want && have && e->tag[0] && access(p, F_OK) == 0 && access(local, F_OK) == 0)
		sl__debug("cache", "the copy %s was changed on disk; downloading it again", local);
	free(want);
	free(have);
	return ok;
}

/*
 * The copy's name (hash of the store, its endpoint, path and its version
 * tag) into name, and key[] what it hashed.  A file with no version: a
 * name of this fetch's own, never another's copy.
 */
static void sl_cache_key(const struct sl__store *st, const char *path, const char *tag, char where[600],
			 char nonce[64], const char *key[4], char name[33])
{
	static _Atomic unsigned long fetches;

	where[0] = 0;
	if (st->where)
		st->where(where, 600);
	if (!tag[0])
		snprintf(nonce, 64, "unversioned %d %lu %llu", (int)getpid(), atomic_fetch_add(&fetches, 1),
			 (unsigned long long)sl__now_ns());
	key[0] = st->name;
	key[1] = where;
	key[2] = path;
	key[3] = tag[0] ? tag : nonce;
	sl_cache_name(key, name);
}

void sl__cache_release(const char *path, const char *tag)
{
	static const struct timespec oldest[2] = { { 0, 0 }, { 0, 0 } };
	char where[600], nonce[64], name[33], p[4096];
	const char *key[4];
	struct sl_cache c;

	if (!tag || !tag[0] || sl_cache_conf(&c))
		return;
	sl_cache_key(sl__store_of(path), path, tag, where, nonce, key, name);
	snprintf(p, sizeof(p), "%s/%s.meta", c.dir, name);
	utimensat(AT_FDCWD, p, oldest, 0); /* eviction goes by the .meta's time (sl_cache_make_room) */
}

static int sl_cache_fetch(const char *path, char tag[SL_TAG_MAX], char *local, size_t cap, const _Atomic int *cancel)
{
	const struct sl__store *st = sl__store_of(path);
	struct sl_cache c;
	char name[33], p[4096], part[4200], where[600], nonce[64], shown[512];
	const char *key[4];
	struct sl__entry e;
	struct statvfs vfs;
	int lock = -1, fd = -1, rc;

	if ((rc = sl_cache_conf(&c)) || (rc = st->info(path, &e)))
		return rc;
	sluice_url_redact(path, shown, sizeof(shown));
	if (e.kind != SL_KIND_FILE)
		return sl__err(-EISDIR, "%s: names a directory or prefix, not a file", shown);
	/* A file pinned to a version (its reader's first) that is another now: never the new bytes under the old. */
	if (tag[0] && strcmp(tag, e.tag))
		return sl__err(-ESTALE, "%s: changed on the server since it was first read (version %s, now %s)", shown,
			       tag, e.tag[0] ? e.tag : "none");
	sl_cache_key(st, path, e.tag, where, nonce, key, name);
	if ((size_t)snprintf(local, cap, "%s/%s.data", c.dir, name) >= cap)
		return sl__err(-ENAMETOOLONG, "%s: the cache path is too long", c.dir);
	snprintf(p, sizeof(p), "%s/%s.lock", c.dir, name);
	if ((lock = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
		return sl__err(-errno, "%s: %s", p, strerror(errno));
	while (flock(lock, LOCK_EX) < 0 && errno == EINTR)
		;
	snprintf(p, sizeof(p), "%s/%s.meta", c.dir, name);
	if (sl_copy_good(p, local, key, &e)) {
		utimensat(AT_FDCWD, p, NULL, 0); /* used now */
		atomic_fetch_add(&sl_hits, 1);
		snprintf(tag, SL_TAG_MAX, "%s", e.tag);
		sl__debug("cache", "%s: cached as %s", shown, local);
		goto out;
	}
	if ((rc = sl_cache_make_room(&c, name, e.size, shown)))
		goto out;
	/* A copy that cannot fit on the disk is not started: nothing is downloaded to be thrown away. */
	if (statvfs(c.dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < e.size) {
		rc = sl__err(-ENOSPC, "%s: %llu bytes do not fit in the cache directory %s (%llu bytes free): free space "
			     "there, or set SLUICE_CACHE_DIR to a larger disk", shown, (unsigned long long)e.size, c.dir,
			     (unsigned long long)vfs.f_bavail * vfs.f_frsize);
		goto out;
	}
	snprintf(part, sizeof(part), "%s/%s.part.%d", c.dir, name, (int)getpid());
	unlink(p); /* a copy changed on disk: its .meta first, so a crash from here on leaves none that matches */
	fd = open(part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = sl__err(-errno, "%s: %s", part, strerror(errno));
		goto out;
	}
	/* The space reserved first: a full disk fails here, before any byte is fetched. */
	if (e.size && (rc = posix_fallocate(fd, 0, (off_t)e.size)) && rc != EOPNOTSUPP && rc != EINVAL) {
		rc = sl__err(-rc, "%s: %llu bytes do not fit in the cache directory %s: %s", shown,
			     (unsigned long long)e.size, c.dir, strerror(rc));
		close(fd);
		unlink(part);
		goto out;
	}
	rc = st->fetch(path, e.tag, fd, cancel, NULL, NULL);
	if (rc == -ENOSPC || rc == -EDQUOT)
		rc = sl__err(rc, "%s; the cache directory %s is full: free space there, or set SLUICE_CACHE_DIR to a "
			     "larger disk", sluice_last_error_detail(), c.dir);
	if (!rc && close(fd) < 0)
		rc = sl__err(-errno, "%s: %s", part, strerror(errno));
	else if (rc)
		close(fd);
	fd = -1;
	if (!rc && rename(part, local) < 0)
		rc = sl__err(-errno, "%s: %s", local, strerror(errno));
	if (rc) {
		unlink(part);
		goto out;
	}
	rc = sl_meta_write(p, local, key, &e);
	atomic_fetch_add(&sl_misses, 1);
	snprintf(tag, SL_TAG_MAX, "%s", e.tag);
	sl__debug("cache", "%s: downloaded to %s (%llu bytes)", shown, local, (unsigned long long)e.size);
out:
	close(lock);
	return rc;
}

int sl__fs_staging(char *out, size_t cap)
{
	struct sl_cache c;
	int rc = sl_cache_conf(&c);

	if (rc)
		return rc;
	if ((size_t)snprintf(out, cap, "%s/staging.XXXXXX", c.dir) >= cap)
		return sl__err(-ENAMETOOLONG, "%s: the staging path is too long", c.dir);
	return mkdtemp(out) ? 0 : sl__err(-errno, "%s: %s", out, strerror(errno));
}

int sl__cache_fetch(const char *path, char tag[SL_TAG_MAX], char *local, size_t cap)
{
	return sl_cache_fetch(path, tag, local, cap, NULL);
}

struct sl__prefetch {
	pthread_t th;
	int started;
	char **paths;
	unsigned n;
	_Atomic int stop;
};

static void *sl_prefetch_run(void *arg)
{
	struct sl__prefetch *p = arg;
	char local[4096];

	for (unsigned i = 0; i < p->n && !atomic_load(&p->stop); i++)
		if (sl_cache_fetch(p->paths[i], (char[SL_TAG_MAX]){ 0 }, local, sizeof(local), &p->stop) &&
		    !atomic_load(&p->stop))
			sl__debug("cache", "prefetch: %s", sluice_last_error_detail()); /* its reader will say */
	return NULL;
}

struct sl__prefetch *sl__cache_prefetch(char *const *paths, unsigned n, const uint64_t *bytes)
{
	struct sl_cache c;
	struct sl__prefetch *p;
	uint64_t total = 0;
	unsigned fit = 0;

	if (!n || sl_cache_conf(&c))
		return NULL;
	while (fit < n && total + bytes[fit] <= c.limit)
		total += bytes[fit++];
	if (!fit || !(p = calloc(1, sizeof(*p))))
		return NULL;
	p->paths = calloc(fit, sizeof(char *));
	for (unsigned i = 0; p->paths && i < fit; i++)
		if (!(p->paths[p->n] = strdup(paths[i])))
			break;
		else
			p->n++;
	p->started = p->paths && pthread_create(&p->th, NULL, sl_prefetch_run, p) == 0;
	if (!p->started) {
		sl__cache_prefetch_stop(p);
		return NULL;
	}
	return p;
}

void sl__cache_prefetch_stop(struct sl__prefetch *p)
{
	if (!p)
		return;
	atomic_store(&p->stop, 1);
	if (p->started)
		pthread_join(p->th, NULL);
	for (unsigned i = 0; p->paths && i < p->n; i++)
		free(p->paths[i]);
	free(p->paths);
	free(p);
}
