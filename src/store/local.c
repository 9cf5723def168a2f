/*
 * What the stores of local files (uring, psync, and gds in gpu/) share:
 * opening a file with its two descriptors, its size, truncation and sync,
 * and the route of a segment (through O_DIRECT, or the page cache).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/names.h"
#include "store/store.h"

int sl__test_refuse_direct;

/* The file's mapping (made by the first caller; NULL where it cannot be: empty, not regular, refused). */
static const char *sl_local_map(struct sl__local *l)
{
	char *m = atomic_load(&l->map), *none = NULL;

	if (m || !l->map_len)
		return m;
	m = mmap(NULL, l->map_len, PROT_READ, MAP_SHARED, l->fd, 0);
	if (m == MAP_FAILED)
		return NULL;
	if (!atomic_compare_exchange_strong(&l->map, &none, m)) { /* another thread's came first */
		munmap(m, l->map_len);
		m = none;
	}
	return m;
}

int sl__local_open(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env)
{
	(void)env;
	return sl__local_open_as(sf, path, flags, sizeof(struct sl__local));
}

int sl__local_open_as(struct sl__sfile *sf, const char *path, int flags, size_t hsize)
{
	int oflags = (flags & SLUICE_RDWR) ? O_RDWR : O_RDONLY, rc;
	struct sl__local *l = calloc(1, hsize);
	struct stat st;

	if ((flags & SLUICE_CREATE) && (flags & SLUICE_RDWR))
		oflags |= O_CREAT;
	if (!l)
		return -ENOMEM;
	l->dfd = -1;
	sf->handle = l;
	l->fd = sl__open_file(path, oflags, 0666);
	if (l->fd < 0)
		rc = l->fd;
	else if (fstat(l->fd, &st) < 0)
		rc = sl__err(-errno, "%s: fstat: %s", path, strerror(errno));
	else
		rc = 0;
	if (rc) {
		sl__local_close(sf);
		return rc;
	}
	atomic_store(&sf->size, (uint64_t)st.st_size);
	errno = EINVAL;
	if (!sl__test_refuse_direct)
		l->dfd = open(path, (oflags & ~O_CREAT) | O_DIRECT | O_CLOEXEC);
	if (l->dfd < 0)
		sl__info("io", "%s: O_DIRECT refused by the filesystem (%s); page cache only", path, strerror(errno));
	sf->direct_ok = l->dfd >= 0;
	l->cachestat = S_ISREG(st.st_mode) && !sl__test_no_cachestat && sl__cachestat(l->fd, 0, SL_ALIGN) >= 0;
	l->map_len = S_ISREG(st.st_mode) ? (size_t)st.st_size : 0;
	if (!l->cachestat)
		sl_local_map(l);
	return 0;
}

void sl__local_close(struct sl__sfile *sf)
{
	struct sl__local *l = sf->handle;

	if (!l)
		return;
	if (atomic_load(&l->map))
		munmap(atomic_load(&l->map), l->map_len);
	if (l->dfd >= 0)
		close(l->dfd);
	if (l->fd >= 0)
		close(l->fd);
	free(l);
	sf->handle = NULL;
}

int sl__local_stat(struct sl__sfile *sf, uint64_t *size)
{
	const struct sl__local *l = sf->handle;
	struct stat st;

	if (fstat(l->fd, &st) < 0)
		return -errno;
	*size = (uint64_t)st.st_size;
	return 0;
}

int sl__local_truncate(struct sl__sfile *sf, const char *path, uint64_t size)
{
	const struct sl__local *l = sf->handle;

	if (ftruncate(l->fd, (off_t)size) < 0)
		return sl__err(-errno, "%s: ftruncate: %s", path, strerror(errno));
	return 0;
}

int sl__local_sync(struct sl__sfile *sf, const char *path)
{
	const struct sl__local *l = sf->handle;

	if (fdatasync(l->fd) < 0)
		return sl__err(-errno, "%s: fdatasync: %s", path, strerror(errno));
	return 0;
}

/*
 * The cached pages of a sample of the pages [first, first+pages): all of
 * them up to 16 MiB, past that 16 windows of 256 KiB spread through them;
 * *asked: the pages sampled.
 */
static int64_t sl_cached_sample(const struct sl__local *l, uint64_t first, uint64_t pages, uint64_t *asked)
{
	const uint64_t win = 64, nwin = 16;
	int64_t got = 0;

	if (pages <= win * nwin) {
		*asked = pages;
		return sl__cachestat(l->fd, first * SL_ALIGN, pages * SL_ALIGN);
	}
	*asked = win * nwin;
	for (uint64_t w = 0; w < nwin && got >= 0; w++) {
		int64_t n = sl__cachestat(l->fd, (first + (pages - win) * w / (nwin - 1)) * SL_ALIGN, win * SL_ALIGN);

		got = n < 0 ? n : got + n;
	}
	return got;
}

/*
 * Is most of [off, off+len) in the page cache?  Asked with cachestat, else
 * by up to 64 pages of the file's mapping sampled with mincore(), a call
 * each: that cost a 4 KiB read 55 us on a small machine, more than its copy.
 */
static int sl_resident(const struct sl__local *l, uint64_t off, size_t len)
{
	uint64_t first = off / SL_ALIGN, last = (off + len - 1) / SL_ALIGN;
	uint64_t pages = last - first + 1, step = pages > 64 ? pages / 64 : 1, asked;
	unsigned hit = 0, tot = 0;
	const char *map = atomic_load(&l->map);
	int64_t got;

	if (l->cachestat && (got = sl_cached_sample(l, first, pages, &asked)) >= 0) /* counts the kernel's pages */
		return (uint64_t)got * (uint64_t)sysconf(_SC_PAGESIZE) * 2 >= asked * SL_ALIGN;
	if (!map || off + len > l->map_len)
		return 0;
	for (uint64_t p = first; p <= last; p += step) {
		unsigned char v = 0;

		if (mincore((char *)map + p * SL_ALIGN, SL_ALIGN, &v) == 0 && (v & 1))
			hit++;
		tot++;
	}
	return hit * 2 >= tot;
}

void sl__local_route(const struct sl__sfile *sf, const struct sl__route_ask *a, struct sl__route *r)
{
	struct sl__local *l = sf->handle;
	const char *map;

	r->store = sf->ops;
	r->handle = sf->handle;
	r->gpu = 0;
	if (l->dfd < 0 || a->cfg->direct == SLUICE_DIRECT_NEVER)
		r->direct = 0;
	else if (a->op == SL_IO_WRITE) /* O_DIRECT writes need an aligned start and length (or padding) */
		r->direct = !(a->off % SL_ALIGN || (a->len % SL_ALIGN && !a->pad_ok));
	else
		r->direct = a->cfg->direct == SLUICE_DIRECT_ALWAYS || !sl_resident(l, a->off, a->len);
	if (a->want_map && a->op == SL_IO_READ && !r->direct && a->len <= l->map_len && a->off <= l->map_len - a->len &&
	    (map = sl_local_map(l)))
		r->map = map + a->off;
}

/* ---- Names ---- */

/* What st says a name is, into e. */
static int sl_local_entry(const char *path, const struct stat *st, struct sl__entry *e)
{
	memset(e, 0, sizeof(*e));
	if (S_ISDIR(st->st_mode)) {
		e->kind = SL_KIND_DIR;
		return 0;
	}
	if (!S_ISREG(st->st_mode))
		return sl__err(-EINVAL, "%s: not a regular file or a directory", path);
	e->kind = SL_KIND_FILE;
	e->size = (uint64_t)st->st_size;
	sl__fs_local_tag(st, e->tag);
	return 0;
}

void sl__fs_local_tag(const struct stat *st, char tag[SL_TAG_MAX])
{
	snprintf(tag, SL_TAG_MAX, "%llx:%llx:%lld.%09ld:%lld", (unsigned long long)st->st_dev,
		 (unsigned long long)st->st_ino, (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec,
		 (long long)st->st_size);
}

int sl__local_info(const char *path, struct sl__entry *e)
{
	struct stat st;

	memset(e, 0, sizeof(*e));
	return stat(path, &st) < 0 ? sl__err(-errno, "%s: %s", path, strerror(errno)) : sl_local_entry(path, &st, e);
}

/* A skipped entry's warning, once a process for each (a dataset's directory is listed by each format's probe). */
static void sl_skipped(const char *path, const char *why)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static uint64_t seen[64];
	static unsigned next;
	uint64_t h = 1469598103934665603ull;
	int again = 0;

	for (const char *c = path; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211ull;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < 64 && !again; i++)
		again = seen[i] == h;
	if (!again)
		seen[next++ % 64] = h;
	pthread_mutex_unlock(&mu);
	if (!again)
		sl__warn("store", "%s: %s, skipped", path, why);
}

/*
 * The files in dir (and below it, with recursive): links are followed, to
 * files and to directories alike (a Hugging Face snapshot is links into
 * its blobs), at most 64 directories deep, so that a link loop ends with
 * -ELOOP naming it.  An entry gone between readdir and its stat is left
 * out: it is not there.
 */
static int sl_local_list_in(const char *dir, int recursive, unsigned depth, int (*add)(void *arg, const char *name),
			    void *arg)
{
	DIR *d;
	struct dirent *e;
	int rc = 0;

	if (depth > 64)
		return sl__err(-ELOOP, "%s: more than 64 directories deep (a loop of symbolic links?)", dir);
	if (!(d = opendir(dir)))
		return sl__err(-errno, "%s: %s", dir, strerror(errno));
	while (!rc && (e = readdir(d))) {
		struct stat st;
		char *p = NULL;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    asprintf(&p, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name) < 0)
			continue;
		/*
		 * Names of regular files (links followed).  A link to nothing, a FIFO, a device or a socket is no
		 * file to read: skipped, but said (a missing shard of a dataset is not dropped without a word).  An
		 * entry gone between readdir and stat is simply gone.
		 */
		if (stat(p, &st) < 0) {
			if (lstat(p, &st) == 0)
				sl_skipped(p, "a link to nothing");
		} else if (S_ISREG(st.st_mode)) {
			rc = add(arg, p);
		} else if (recursive && S_ISDIR(st.st_mode)) {
			rc = sl_local_list_in(p, 1, depth + 1, add, arg);
		} else if (!S_ISDIR(st.st_mode)) {
			sl_skipped(p, "not a regular file (a FIFO, device or socket)");
		}
		free(p);
	}
	closedir(d);
	return rc;
}

int sl__local_list(const char *dir, int recursive, int (*add)(void *arg, const char *name), void *arg)
{
	return sl_local_list_in(dir, recursive, 0, add, arg);
}

/* ---- A tree for a copy: links decided as pack decides them ---- */

enum { SL_TREE_MAX = 1u << 24 };
unsigned sl__test_tree_max; /* a test's smaller bound (0: SL_TREE_MAX) */

struct sl_tree {
	unsigned flags;
	char root[PATH_MAX];    /* the tree's real path */
	const char *shown;      /* as the caller named it */
	struct sl__dirs dirs;   /* on the walk's path: loops */
	int (*add)(void *arg, const struct sl__tree_entry *e);
	void *arg;
	uint64_t skipped;
	unsigned walked;        /* files and directories so far, at most SL_TREE_MAX */
};

/* The path of real (below the root, or absolute), malloc'd. */
static char *sl_tree_path(const struct sl_tree *t, const char *real)
{
	char *p = NULL;

	if (asprintf(&p, "%s%s%s", real[0] == '/' ? "" : t->root, real[0] && real[0] != '/' && strcmp(t->root, "/") ? "/" : "",
		     real) < 0)
		return NULL;
	return p;
}

/*
 * The target of a link at the directory from (below the root) to the
 * file to (below it too), as a relative name: "../" for each segment of
 * from past what the two share, then the rest of to.  Both are real paths
 * (no link, no "." or ".." in them), so the name leads there in the copy
 * as in the tree.  malloc'd.
 */
static char *sl_rel_target(const char *from, const char *to)
{
	const char *f = from, *t = to;
	size_t up = 0, k = 0, cap;
	char *out;

	/* The segments the two share, whole. */
	while (*f && *t) {
		size_t fl = strcspn(f, "/"), tl = strcspn(t, "/");

		if (fl != tl || memcmp(f, t, fl))
			break;
		f += fl + (f[fl] == '/');
		t += tl + (t[tl] == '/');
	}
	for (const char *c = f; *c; c++)
		up += c == f || c[-1] == '/';
	if (!(out = malloc(cap = 3 * up + strlen(t) + 2)))
		return NULL;
	for (size_t i = 0; i < up; i++)
		k += (size_t)snprintf(out + k, cap - k, i + 1 < up || *t ? "../" : "..");
	snprintf(out + k, cap - k, "%s", *t || up ? t : ".");
	return out;
}

/*
 * One more file or directory to walk; an error past SL_TREE_MAX: links
 * inside a tree can make a few directories very many (each of d0/a, d0/b
 * leading to d1, each of d1/a, d1/b to d2, ...: 2^30 after 30 levels).
 */
static int sl_tree_count(struct sl_tree *t)
{
	const unsigned max = sl__test_tree_max ? sl__test_tree_max : SL_TREE_MAX;

	if (++t->walked <= max)
		return 0;
	return sl__err(-E2BIG, "%s: more than %u files and directories to copy (links inside it leading to the same "
		       "directories again and again?); --links copies them as links", t->shown, max);
}

static int sl_tree_dir(struct sl_tree *t, const char *rel, const char *real, const struct stat *dst);

/* One entry of a directory: taken, walked, or skipped and named. */
static int sl_tree_entry(struct sl_tree *t, const char *rel, const char *real, const char *name)
{
	char target[PATH_MAX], *erel = NULL, *ereal = NULL, *path = NULL, *link = NULL;
	size_t rl = strlen(t->root);
	struct stat st;
	int where, rc = 0;

	if (asprintf(&erel, "%s%s%s", rel, *rel ? "/" : "", name) < 0 ||
	    asprintf(&ereal, "%s%s%s", real, *real ? "/" : "", name) < 0 || !(path = sl_tree_path(t, ereal))) {
		rc = -ENOMEM;
		goto out;
	}
	where = sl__link_where(t->root, path, &st, target);
	if (where == -ENOENT) /* gone since readdir: it is not there */
		goto out;
	if (where < 0) {
		rc = sl__err(where, "%s/%s: %s", t->shown, erel, strerror(-where));
		goto out;
	}
	if (where == SL_LINK_IN || (where == SL_LINK_OUT && (t->flags & SL_TREE_FOLLOW))) {
		/* The link is taken as its target: named from here on by the target's real path. */
		free(ereal);
		ereal = strdup(where == SL_LINK_OUT ? target : !strcmp(t->root, "/") ? target + 1
							     : target[rl] ? target + rl + 1 : "");
		if (!ereal) {
			rc = -ENOMEM;
			goto out;
		}
	} else if (where != SL_LINK_NONE) {
		char shown[PATH_MAX + 64];

		snprintf(shown, sizeof(shown), "%s/%s", t->shown, erel);
		sl__link_skipped("copy", where, shown, t->shown, target, where == SL_LINK_OUT ? "-L" : NULL);
		t->skipped++;
		goto out;
	}
	if (where == SL_LINK_IN && (t->flags & SL_TREE_LINKS) && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
		/* Kept as a link: the walk reaches rel through real directories alone, so rel's directory is real's. */
		if (!(link = sl_rel_target(real, ereal)))
			rc = -ENOMEM;
		else
			rc = t->add(t->arg, &(struct sl__tree_entry){ erel, ereal, link, &st });
	} else if (S_ISREG(st.st_mode)) {
		if (!(rc = sl_tree_count(t)))
			rc = t->add(t->arg, &(struct sl__tree_entry){ erel, ereal, NULL, &st });
	} else if (S_ISDIR(st.st_mode)) {
		rc = sl_tree_dir(t, erel, ereal, &st);
	} else {
		char shown[PATH_MAX + 64], p[1024];

		snprintf(shown, sizeof(shown), "%s/%s", t->shown, erel);
		sl__warn("copy", "%s: not a regular file (a %s), skipped", sl__printable(shown, p, sizeof(p)),
			 sl__file_kind(st.st_mode));
		t->skipped++;
	}
out:
	free(erel);
	free(ereal);
	free(path);
	free(link);
	return rc;
}

/* The directory real (below the root, or absolute), reached as rel, whose stat is dst. */
static int sl_tree_dir(struct sl_tree *t, const char *rel, const char *real, const struct stat *dst)
{
	char *path = sl_tree_path(t, real);
	int rc = path ? sl_tree_count(t) : -ENOMEM;
	struct dirent *e;
	DIR *d;

	if (rc == 0)
		rc = sl__dirs_enter(&t->dirs, dst);
	if (rc == 0) {
		char shown[PATH_MAX + 64], p[1024];

		snprintf(shown, sizeof(shown), "%s/%s", t->shown, rel);
		sl__warn("copy", "%s: a link back to a directory above it, skipped", sl__printable(shown, p, sizeof(p)));
		t->skipped++;
	}
	if (rc == -ELOOP)
		rc = sl__err(-ELOOP, "%s/%s: more than %u directories deep", t->shown, rel, SL_DIRS_DEEP);
	if (rc <= 0) {
		free(path);
		return rc;
	}
	rc = 0;
	if (!(d = opendir(path)))
		rc = sl__err(-errno, "%s%s%s: %s", t->shown, *rel ? "/" : "", rel, strerror(errno));
	while (d && !rc && (errno = 0, e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			rc = sl_tree_entry(t, rel, real, e->d_name);
	if (d && !rc && errno)
		rc = sl__err(-errno, "%s%s%s: %s", t->shown, *rel ? "/" : "", rel, strerror(errno));
	if (d)
		closedir(d);
	sl__dirs_leave(&t->dirs);
	free(path);
	return rc;
}

int sl__local_tree(const char *root, unsigned flags, int (*add)(void *arg, const struct sl__tree_entry *e), void *arg,
		   uint64_t *skipped)
{
	struct sl_tree *t = calloc(1, sizeof(*t));
	struct stat st;
	int rc;

	if (!t)
		return -ENOMEM;
	t->flags = flags;
	t->shown = root;
	t->add = add;
	t->arg = arg;
	if (!realpath(root, t->root) || stat(t->root, &st) < 0)
		rc = sl__err(-errno, "%s: %s", root, strerror(errno));
	else if (!S_ISDIR(st.st_mode))
		rc = sl__err(-ENOTDIR, "%s: not a directory", root);
	else
		rc = sl_tree_dir(t, "", "", &st);
	*skipped = t->skipped;
	free(t);
	return rc;
}

int sl__local_remove(const char *path)
{
	return unlink(path) < 0 ? sl__err(-errno, "%s: %s", path, strerror(errno)) : 0;
}

int sl__local_copy_fd(int in, uint64_t size, int fd, const _Atomic int *cancel, const char *shown)
{
	uint64_t done = 0;
	int rc = 0;

	while (!rc && done < size) {
		ssize_t n = cancel && atomic_load(cancel) ? -ECANCELED : copy_file_range(in, NULL, fd, NULL, size - done, 0);

		if (n == -ECANCELED)
			rc = sl__err(-ECANCELED, "%s: cancelled", shown);
		else if (n < 0 && errno != EINTR)
			rc = sl__err(-errno, "%s: %s", shown, strerror(errno));
		else if (n == 0)
			rc = sl__err(SLUICE_ESHORT, "%s: shrank while it was copied", shown);
		else if (n > 0)
			done += (uint64_t)n;
	}
	return rc;
}

/* The file as of tag copied into fd (copy_file_range: in the kernel, or shared blocks where the filesystem can). */
int sl__local_fetch(const char *path, const char *tag, int fd, const _Atomic int *cancel, int *verified,
		    char sum_name[48])
{
	struct sl__entry e;
	struct stat st;
	int in = sl__open_file(path, O_RDONLY, 0), rc = 0;

	if (verified)
		*verified = 0;
	if (sum_name)
		snprintf(sum_name, 48, "none (a local file)");
	if (in < 0)
		return in;
	/* The version of the file opened, not of whatever the path names by now. */
	if (fstat(in, &st) < 0)
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
	else if ((rc = sl_local_entry(path, &st, &e)) == 0 && e.kind != SL_KIND_FILE)
		rc = sl__err(-EISDIR, "%s: a directory", path);
	if (!rc && tag && strcmp(tag, e.tag))
		rc = sl__err(-ESTALE, "%s: changed since it was listed", path);
	if (!rc)
		rc = sl__local_copy_fd(in, e.size, fd, cancel, path);
	close(in);
	return rc;
}
