/*
 * The local cache of remote objects (remote.h).  DIR/<h>.data is the
 * copy, DIR/<h>.meta says what it is a copy of (URL, endpoint, size,
 * ETag, the object's checksum) and which file on disk it was written as
 * (inode and ctime), and its modification time is the last use;
 * DIR/<h>.lock is the object's lock; h hashes the endpoint and the URL.
 * A copy is renamed into place whole and its .meta written after it, so a
 * crash leaves at worst a copy whose .meta does not match: it is
 * downloaded again.  DIR/<h>.part.PID is a download in progress; one whose
 * process is gone is removed by the next eviction pass.
 *
 * A copy is checked on the way in (the download matches the object's
 * checksum) and on reuse: a copy whose inode or ctime changed since it
 * was written (something wrote into it) is checked against the checksum
 * again, or downloaded again where the object has none.
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

#include "remote/remote.h"

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
		return sl__err(SLUICE_EINVAL_CONFIG, "no cache directory for s3:// datasets: set SLUICE_CACHE_DIR");
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

/* 128 bits of FNV-1a over the endpoint and the URL, as hex. */
static void sl_cache_name(const char *endpoint, const char *url, char out[33])
{
	uint64_t h[2] = { 0xcbf29ce484222325ull, 0x6c62272e07bb0142ull };

	for (int k = 0; k < 2; k++) {
		for (const char *s = endpoint; *s; s++)
			h[k] = (h[k] ^ (unsigned char)*s) * 0x100000001b3ull;
		h[k] = (h[k] ^ '\n') * 0x100000001b3ull;
		for (const char *s = url; *s; s++)
			h[k] = (h[k] ^ (unsigned char)*s) * 0x100000001b3ull;
	}
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

/* What a .meta says of its copy beside the object's own size and ETag. */
struct sl_meta {
	uint64_t size;
	char etag[128];
	int sum_kind;                 /* the object's checksum, SL_CRC_NONE if it has none */
	uint32_t sum;
	unsigned long long ino, ctime_ns; /* the copy as it was written */
};

/* The .meta, if it describes url at endpoint. */
static int sl_meta_read(const char *path, const char *endpoint, const char *url, struct sl_meta *m)
{
	char line[4200], want_url[4200], want_ep[600];
	uint64_t *size = &m->size;
	char *etag = m->etag;
	size_t cap = sizeof(m->etag);
	int have = 0, fd = sl__open_file(path, O_RDONLY, 0);
	FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;

	memset(m, 0, sizeof(*m));
	if (!f) {
		if (fd >= 0)
			close(fd);
		sl__err_clear(); /* absent or not a file: no copy to trust */
		return -1;
	}
	snprintf(want_url, sizeof(want_url), "url %s\n", url);
	snprintf(want_ep, sizeof(want_ep), "endpoint %s\n", endpoint);
	while (fgets(line, sizeof(line), f)) {
		if (!strcmp(line, want_url))
			have |= 1;
		else if (!strcmp(line, want_ep))
			have |= 2;
		else if (!strncmp(line, "size ", 5) && sscanf(line + 5, "%llu", (unsigned long long *)size) == 1)
			have |= 4;
		else if (!strncmp(line, "etag ", 5) && strlen(line + 5) < cap) {
			snprintf(etag, cap, "%s", line + 5);
			etag[strcspn(etag, "\n")] = 0;
			have |= 8;
		} else if (!strncmp(line, "sum ", 4) && sscanf(line + 4, "%d %x", &m->sum_kind, &m->sum) != 2) {
			m->sum_kind = SL_CRC_NONE;
		} else if (!strncmp(line, "stamp ", 6)) {
			(void)!sscanf(line + 6, "%llu %llu", &m->ino, &m->ctime_ns);
		}
	}
	fclose(f);
	return have == 15 ? 0 : -1;
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
static int sl_cache_make_room(const struct sl_cache *c, const char *self, uint64_t need, const char *url)
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

		/* Downloads in progress count; those of processes that are gone are removed. */
		if (l > 38 && !strncmp(e->d_name + 32, ".part.", 6) && (pid = strtol(e->d_name + 38, &end, 10)) > 0 &&
		    !*end) {
			snprintf(p, sizeof(p), "%s/%s", c->dir, e->d_name);
			if (kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
				if (unlink(p) == 0)
					sl__debug("cache", "%s: removed (its process %ld is gone)", p, pid);
			} else if (stat(p, &sd) == 0) {
				total += (uint64_t)sd.st_blocks * 512;
			}
			continue;
		}
		if (l != 37 || strcmp(e->d_name + 32, ".meta") || !strncmp(e->d_name, self, 32))
			continue;
		snprintf(p, sizeof(p), "%s/%.32s.data", c->dir, e->d_name);
		if (stat(p, &sd) < 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", c->dir, e->d_name);
		if (stat(p, &sm) < 0 || sl__reserve(&v, &cap, (n + 1) * sizeof(*v)))
			continue;
		snprintf(v[n].name, sizeof(v[n].name), "%.32s", e->d_name);
		v[n].bytes = (uint64_t)sd.st_blocks * 512;
		v[n].used = sm.st_mtim;
		total += v[n++].bytes;
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof(*v), sl_older);
	for (size_t i = 0; i < n && total + need > c->limit; i++) {
		int fd;

		snprintf(p, sizeof(p), "%s/%s.lock", c->dir, v[i].name);
		if ((fd = open(p, O_RDWR | O_CLOEXEC)) < 0)
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
			     "SLUICE_CACHE_LIMIT (%llu bytes)", c->dir, url, (unsigned long long)need,
			     (unsigned long long)total, (unsigned long long)c->limit);
	free(v);
	return rc;
}

/* The CRC (of kind) of the file at path; 0 or -errno. */
static int sl_file_crc(const char *path, int kind, uint32_t *crc)
{
	enum { CHUNK = 4 << 20 };
	char *buf = malloc(CHUNK);
	int fd = sl__open_file(path, O_RDONLY, 0), rc = 0;
	ssize_t n;

	*crc = 0;
	if (fd < 0 || !buf)
		rc = fd < 0 ? fd : -ENOMEM;
	while (!rc && (n = read(fd, buf, CHUNK)) != 0) {
		if (n < 0 && errno != EINTR)
			rc = -errno;
		else if (n > 0)
			*crc = sl__crc(kind, *crc, buf, (size_t)n);
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

/* The copy at path against m's one-pass checksum (sum.c): 1 matched, else 0 or an error. */
static int sl_file_osum(const char *path, const struct sl__s3_meta *m, const char *url)
{
	int fd = sl__open_file(path, O_RDONLY, 0), rc;

	if (fd < 0)
		return fd;
	rc = sl__osum_check_fd(m, fd, url);
	close(fd);
	return rc;
}

/* Writes the .meta at p for the copy at local of url (m: the object as its HEAD said). */
static int sl_meta_write(const char *p, const char *local, const char *url, const char *endpoint,
			 const struct sl__s3_meta *m)
{
	char tmp[4200];
	struct stat st;
	FILE *f;
	int ok;

	if (stat(local, &st) < 0)
		return sl__err(-errno, "%s: %s", local, strerror(errno));
	snprintf(tmp, sizeof(tmp), "%s.%d", p, (int)getpid());
	errno = 0;
	f = fopen(tmp, "we");
	ok = f && fprintf(f, "url %s\nendpoint %s\nsize %llu\netag %s\nsum %d %08x\nstamp %llu %llu\n", url, endpoint,
			  (unsigned long long)m->size, m->etag, m->sum_kind, m->sum, (unsigned long long)st.st_ino,
			  (unsigned long long)st.st_ctim.tv_sec * 1000000000ull + (unsigned long long)st.st_ctim.tv_nsec) > 0;
	if (f && fclose(f) != 0)
		ok = 0;
	if (!ok || rename(tmp, p) < 0) {
		int e = errno ? errno : EIO;

		unlink(tmp);
		return sl__err(-e, "%s: %s", p, strerror(e));
	}
	return 0;
}

/*
 * 1 if the copy at local is the object m describes: the .meta at p says
 * so, and the copy is the file written then (same inode and ctime) or,
 * where it changed, still matches the object's checksum.
 */
static int sl_copy_good(const char *p, const char *local, const char *url, const char *endpoint,
			const struct sl__s3_meta *m)
{
	struct sl_meta have;
	struct stat st;
	uint32_t crc;

	if (sl_meta_read(p, endpoint, url, &have) || have.size != m->size || strcmp(have.etag, m->etag) ||
	    stat(local, &st) < 0 || (uint64_t)st.st_size != m->size)
		return 0;
	if (have.ino == (unsigned long long)st.st_ino &&
	    have.ctime_ns == (unsigned long long)st.st_ctim.tv_sec * 1000000000ull + (unsigned long long)st.st_ctim.tv_nsec)
		return 1;
	if (m->osum_kind ? sl_file_osum(local, m, url) != 1
			 : !m->sum_kind || sl_file_crc(local, m->sum_kind, &crc) || crc != m->sum) {
		sl__warn("cache", "%s: the cached copy %s was changed on disk%s; downloading it again", url, local,
			 m->sum_kind || m->osum_kind ? " and no longer matches the object's checksum" : "");
		return 0;
	}
	return sl_meta_write(p, local, url, endpoint, m) == 0;
}

static int sl_cache_fetch(const char *url, char *local, size_t cap, const _Atomic int *cancel)
{
	struct sl_cache c;
	struct sl__s3 *s3;
	struct sl__http_conn *conn = sl__http_thread_conn();
	char bucket[64], key[1025], name[33], p[4096], part[4200];
	struct sl__s3_meta m;
	struct statvfs vfs;
	const char *ep;
	int lock = -1, fd = -1, rc;

	if ((rc = sl__s3_parse_url(url, bucket, sizeof(bucket), key, sizeof(key))))
		return rc;
	if (!key[0])
		return sl__err(-EISDIR, "%s: names a bucket or prefix, not an object", url);
	if ((rc = sl_cache_conf(&c)) || (rc = sl__s3_default(&s3)))
		return rc;
	if (!conn)
		return sl__err(-ENOMEM, "%s: no connection", url);
	if ((rc = sl__s3_head(s3, conn, bucket, key, &m)))
		return rc;
	ep = sl__s3_conf(s3)->endpoint;
	sl_cache_name(ep, url, name);
	if ((size_t)snprintf(local, cap, "%s/%s.data", c.dir, name) >= cap)
		return sl__err(-ENAMETOOLONG, "%s: the cache path is too long", c.dir);
	snprintf(p, sizeof(p), "%s/%s.lock", c.dir, name);
	if ((lock = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return sl__err(-errno, "%s: %s", p, strerror(errno));
	while (flock(lock, LOCK_EX) < 0 && errno == EINTR)
		;
	snprintf(p, sizeof(p), "%s/%s.meta", c.dir, name);
	if (sl_copy_good(p, local, url, ep, &m)) {
		utimensat(AT_FDCWD, p, NULL, 0); /* used now */
		atomic_fetch_add(&sl_hits, 1);
		sl__debug("cache", "%s: cached as %s", url, local);
		goto out;
	}
	if ((rc = sl_cache_make_room(&c, name, m.size, url)))
		goto out;
	/* A copy that cannot fit on the disk is not started: nothing is downloaded to be thrown away. */
	if (statvfs(c.dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < m.size) {
		rc = sl__err(-ENOSPC, "%s: %llu bytes do not fit in the cache directory %s (%llu bytes free): free space "
			     "there, or set SLUICE_CACHE_DIR to a larger disk", url, (unsigned long long)m.size, c.dir,
			     (unsigned long long)vfs.f_bavail * vfs.f_frsize);
		goto out;
	}
	snprintf(part, sizeof(part), "%s/%s.part.%d", c.dir, name, (int)getpid());
	fd = open(part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); /* read back for a one-pass checksum */
	if (fd < 0) {
		rc = sl__err(-errno, "%s: %s", part, strerror(errno));
		goto out;
	}
	/* The space reserved first: a full disk fails here, before any byte is fetched. */
	if (m.size && (rc = posix_fallocate(fd, 0, (off_t)m.size)) && rc != EOPNOTSUPP && rc != EINVAL) {
		rc = sl__err(-rc, "%s: %llu bytes do not fit in the cache directory %s: %s", url,
			     (unsigned long long)m.size, c.dir, strerror(rc));
		close(fd);
		unlink(part);
		goto out;
	}
	rc = sl__s3_download(s3, bucket, key, &m, fd, cancel, NULL);
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
	rc = sl_meta_write(p, local, url, ep, &m);
	atomic_fetch_add(&sl_misses, 1);
	sl__debug("cache", "%s: downloaded to %s (%llu bytes)", url, local, (unsigned long long)m.size);
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

int sl__cache_fetch(const char *url, char *local, size_t cap)
{
	return sl_cache_fetch(url, local, cap, NULL);
}

struct sl__prefetch {
	pthread_t th;
	int started;
	char **urls;
	unsigned n;
	_Atomic int stop;
};

static void *sl_prefetch_run(void *arg)
{
	struct sl__prefetch *p = arg;
	char local[4096];

	for (unsigned i = 0; i < p->n && !atomic_load(&p->stop); i++)
		if (sl_cache_fetch(p->urls[i], local, sizeof(local), &p->stop) && !atomic_load(&p->stop))
			sl__debug("cache", "prefetch: %s", sluice_last_error_detail()); /* its reader will say */
	return NULL;
}

struct sl__prefetch *sl__cache_prefetch(char *const *urls, unsigned n, uint64_t total)
{
	struct sl_cache c;
	struct sl__prefetch *p;

	if (!n || sl_cache_conf(&c) || total > c.limit || !(p = calloc(1, sizeof(*p))))
		return NULL;
	p->urls = calloc(n, sizeof(char *));
	for (unsigned i = 0; p->urls && i < n; i++)
		if (!(p->urls[p->n] = strdup(urls[i])))
			break;
		else
			p->n++;
	p->started = p->urls && pthread_create(&p->th, NULL, sl_prefetch_run, p) == 0;
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
	for (unsigned i = 0; p->urls && i < p->n; i++)
		free(p->urls[i]);
	free(p->urls);
	free(p);
}
