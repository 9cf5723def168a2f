/*
 * Names and whole files through the registry (names.h): each call asks
 * the path's store, whatever it is.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/names.h"
#include "store/store.h"

void (*sl__test_copy_listed)(void), (*sl__test_part_written)(void);

/* Name ops get no engine: a store's process-wide state serves them. */
static const struct sl__open_env sl_no_engine;

static int sl_unsupported(const struct sl__store *st, const char *path, const char *what)
{
	return sl__err(-EOPNOTSUPP, "%s: the %s store cannot %s", path, st->name, what);
}

int sl__fs_stat(const char *path, struct stat *st)
{
	struct sl__entry e;
	int rc = sl__store_of(path)->info(path, &e);

	memset(st, 0, sizeof(*st));
	if (rc)
		return rc;
	st->st_mode = e.kind == SL_KIND_DIR ? S_IFDIR | 0555 : S_IFREG | 0444;
	st->st_size = (off_t)e.size;
	return 0;
}

int sl__fs_is_local(const char *path)
{
	return !!(sl__store_of(path)->caps & SL_STORE_LOCAL);
}

int sl__fs_url_names(const char *path)
{
	return !!(sl__store_of(path)->caps & SL_STORE_URL_NAMES);
}

void sl__trim_slashes(char *path)
{
	for (size_t l = path ? strlen(path) : 0; l > 1 && path[l - 1] == '/' && path[l - 2] != '/'; l--)
		path[l - 1] = 0;
}

const char *sluice_path_store(const char *path, unsigned *flags)
{
	const struct sl__store *st = sl__store_of(path ? path : "");

	if (flags)
		*flags = (st->caps & SL_STORE_LOCAL ? SLUICE_STORE_LOCAL : 0) | (st->list ? SLUICE_STORE_LISTS : 0) |
			 (st->put || st->truncate ? SLUICE_STORE_WRITES : 0);
	return st->caps & SL_STORE_LOCAL ? "local" : st->name;
}

static int sl_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct sl_names {
	char **v;
	unsigned n;
	size_t cap;
};

static int sl_add(void *arg, const char *name)
{
	struct sl_names *l = arg;

	if (l->n == UINT32_MAX || sl__reserve(&l->v, &l->cap, ((size_t)l->n + 1) * sizeof(char *)) ||
	    !(l->v[l->n] = strdup(name)))
		return -ENOMEM;
	l->n++;
	return 0;
}

int sl__fs_list(const char *dir, int recursive, char ***names, unsigned *n)
{
	const struct sl__store *st = sl__store_of(dir);
	struct sl_names l = { 0 };
	int rc = st->list ? st->list(dir, recursive, sl_add, &l) : sl_unsupported(st, dir, "list names");

	*names = NULL;
	*n = 0;
	if (rc) {
		sluice_list_free(l.v, l.n);
		return rc;
	}
	if (l.n)
		qsort(l.v, l.n, sizeof(char *), sl_cmp);
	/* Once each: a listing may link a file twice (Apache's icon and name). */
	for (unsigned i = 0; i < l.n; i++)
		if (*n && !strcmp(l.v[i], l.v[*n - 1]))
			free(l.v[i]);
		else
			l.v[(*n)++] = l.v[i];
	*names = l.v;
	return 0;
}

int sluice_list(const char *dir, int recursive, char ***names, unsigned *n)
{
	sl__err_clear();
	if (!dir || !names || !n)
		return sl__err(-EINVAL, "sluice_list: a directory and where to put its names");
	return sl__fs_list(dir, recursive, names, n);
}

void sluice_list_free(char **names, unsigned n)
{
	for (unsigned i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

int sl__fs_version(const char *path, char tag[SL_TAG_MAX])
{
	struct sl__entry e;
	int rc = sl__store_of(path)->info(path, &e);

	snprintf(tag, SL_TAG_MAX, "%s", rc ? "" : e.tag);
	return rc;
}

int sl__fs_local(const char *path, char tag[SL_TAG_MAX], char *local, size_t cap)
{
	if (!sl__fs_is_local(path))
		return sl__cache_fetch(path, tag, local, cap);
	if ((size_t)snprintf(local, cap, "%s", path) >= cap)
		return sl__err(-ENAMETOOLONG, "%s: path too long", path);
	return 0;
}

/*
 * An upload's source: a local file read piece by piece as the store asks
 * (a put's copy), never mapped, so that a file cut short meanwhile is an
 * error naming it, not a SIGBUS.  The store sees the file as memory from
 * SL_UPLOAD_BASE: a piece at SL_UPLOAD_BASE + off is the file's bytes at off.
 */
#define SL_UPLOAD_BASE ((const char *)4096)

struct sl_upload {
	int fd;
	const char *local;
	struct sl__fs_watch *w; /* or NULL */
};

static int sl_upload_read(void *ctx, void *dst, const void *src, size_t n)
{
	const struct sl_upload *u = ctx;
	uint64_t off = (uint64_t)((const char *)src - SL_UPLOAD_BASE);
	ssize_t got = sl__pio_full(SL_IO_READ, u->fd, dst, n, off);

	if (got < 0)
		return sl__err((int)got, "%s: %s", u->local, strerror((int)-got));
	if (u->w)
		atomic_fetch_add(&u->w->sent, (uint64_t)got);
	return (size_t)got == n ? 0 : sl__err(SLUICE_ESHORT, "%s: shrank while it was uploaded", u->local);
}

/* Nonzero where the open file fd is not as before says (its size or time of last change): it changed meanwhile. */
static int sl_changed(int fd, const struct stat *before, const char *shown)
{
	struct stat now;

	if (fstat(fd, &now) < 0)
		return sl__err(-errno, "%s: %s", shown, strerror(errno));
	return now.st_size != before->st_size || now.st_mtim.tv_sec != before->st_mtim.tv_sec ||
	       now.st_mtim.tv_nsec != before->st_mtim.tv_nsec;
}

int sl__fs_upload_fd(int fd, const char *local, const char *path, struct sl__fs_watch *w)
{
	const struct sl__store *st = sl__store_of(path);
	struct sl_upload u = { fd, local, w };
	struct stat sb;
	int rc;

	if (!st->put)
		return sl_unsupported(st, path, "write whole files");
	if (fstat(fd, &sb) < 0)
		return sl__err(-errno, "%s: %s", local, strerror(errno));
	if ((rc = st->put(path, SL_UPLOAD_BASE, (size_t)sb.st_size, sl_upload_read, &u, &sl_no_engine)))
		return rc;
	return sl_changed(fd, &sb, local) ? sl__err(-ESTALE, "%s: changed while it was uploaded: %s may hold parts of "
						      "two versions of it; copy it again", local, path) : 0;
}

int sl__fs_upload(const char *local, const char *path)
{
	int fd, rc;

	if (!sl__store_of(path)->put)
		return sl__fs_upload_fd(-1, local, path, NULL);
	if ((fd = sl__open_file(local, O_RDONLY, 0)) < 0)
		return fd;
	rc = sl__fs_upload_fd(fd, local, path, NULL);
	close(fd);
	return rc;
}

static void sl_watch_fd(struct sl__fs_watch *w, int fd)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->fd = fd;
	pthread_mutex_unlock(&w->lock);
}

int sl__fs_download(const char *path, int src_fd, int dirfd, const char *name, const char *shown, int *verified,
		    char sum_name[48], struct sl__fs_watch *w)
{
	const struct sl__store *st = sl__store_of(path);
	const char *slash = strrchr(name, '/');
	char *dir = slash ? strndup(name, (size_t)(slash - name + (slash == name))) : NULL, *tmp = NULL;
	struct stat sb;
	int fd, rc;

	if (slash && !dir)
		return -ENOMEM;
	if ((rc = sl__replaceable_at(dirfd, name, shown))) {
		free(dir);
		return rc;
	}
	/*
	 * Beside it, under the name every durable write's temporary has: those
	 * of copies killed before their rename are removed here (not a live
	 * one's); O_EXCL, a file of our own, never one linked (hard or soft) there.
	 */
	fd = sl__tmp_open(dirfd, dir, slash ? slash + 1 : name, 0666, NULL, &tmp);
	free(dir);
	if (fd < 0)
		return sl__err(fd, "%s: cannot create its temporary beside it: %s", shown, strerror(-fd));
	sl_watch_fd(w, fd);
	if (src_fd < 0)
		rc = st->fetch(path, NULL, fd, NULL, verified, sum_name);
	else if (fstat(src_fd, &sb) < 0)
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
	else
		rc = sl__local_copy_fd(src_fd, (uint64_t)sb.st_size, fd, NULL, path);
	sl_watch_fd(w, -1);
	if (src_fd >= 0 && sum_name)
		snprintf(sum_name, 48, "none (a local file)");
	if (src_fd >= 0 && verified)
		*verified = 0;
	if (close(fd) < 0 && !rc)
		rc = sl__err(-errno, "%s: %s", shown, strerror(errno));
	if (!rc && sl__test_part_written)
		sl__test_part_written();
	/* A local source written to meanwhile: what was copied may be parts of two versions, never renamed into place. */
	if (!rc && src_fd >= 0 && sl_changed(src_fd, &sb, path))
		rc = sl__err(-ESTALE, "%s: changed while it was copied (its size or time of change is another now): "
			     "not copied", path);
	if (!rc && renameat(dirfd, tmp, dirfd, name) < 0)
		rc = sl__err(-errno, "%s: %s", shown, strerror(errno));
	if (rc)
		unlinkat(dirfd, tmp, 0);
	free(tmp);
	return rc;
}

int sl__fs_link(const char *target, int dirfd, const char *name, const char *shown)
{
	const char *slash = strrchr(name, '/');
	char *dir = slash ? strndup(name, (size_t)(slash - name + (slash == name))) : NULL, *tmp = NULL;
	struct stat sb;
	int rc;

	if (slash && !dir)
		return -ENOMEM;
	/* What is there already: nothing, a file or a link is replaced; a directory is not (a link never writes into one). */
	if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode)) {
		free(dir);
		return sl__err(S_ISDIR(sb.st_mode) ? -EISDIR : -EINVAL, "%s: exists and is not a regular file or a link (a "
			       "%s): not replaced", shown, sl__file_kind(sb.st_mode));
	}
	rc = sl__tmp_open(dirfd, dir, slash ? slash + 1 : name, 0, target, &tmp);
	free(dir);
	if (rc < 0)
		return sl__err(rc, "%s: cannot make a symbolic link beside it: %s", shown, strerror(-rc));
	if (renameat(dirfd, tmp, dirfd, name) < 0) {
		rc = sl__err(-errno, "%s: %s", shown, strerror(errno));
		unlinkat(dirfd, tmp, 0);
	}
	free(tmp);
	return rc;
}

int sluice_remove(const char *path)
{
	sl__err_clear();
	return path ? sl__fs_remove(path) : sl__err(-EINVAL, "sluice_remove: no path");
}

int sl__fs_remove(const char *path)
{
	const struct sl__store *st = sl__store_of(path);

	return st->remove ? st->remove(path) : sl_unsupported(st, path, "remove files");
}

int sluice_page_cache_evict(const char *path, uint64_t *cached, char *why, size_t cap)
{
	char tag[SL_TAG_MAX] = "", local[4096];
	int fd, rc;

	sl__err_clear();
	if (cached)
		*cached = 0;
	if (why && cap)
		why[0] = 0;
	if (!path || !*path)
		return sl__err(-EINVAL, "sluice_page_cache_evict: no path");
	/* A remote file is read from its copy in the cache: that copy is what goes cold. */
	if ((rc = sl__fs_local(path, tag, local, sizeof(local))))
		return rc;
	if ((fd = sl__open_file(local, O_RDONLY, 0)) < 0)
		return fd;
	rc = sl__page_cache_evict(fd, local, cached, why, cap);
	close(fd);
	return rc;
}
