/*
 * What the stores of local files (uring, psync, and gds in gpu/) share:
 * opening a file with its two descriptors, its size, truncation and sync,
 * and the route of a segment (through O_DIRECT, or the page cache).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store.h"

int sl__test_refuse_direct;

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
	l->fd = open(path, oflags | O_CLOEXEC, 0666);
	if (l->fd < 0)
		rc = sl__err(-errno, "%s: cannot open: %s", path, strerror(errno));
	else if (fstat(l->fd, &st) < 0)
		rc = sl__err(-errno, "%s: fstat: %s", path, strerror(errno));
	else if (S_ISDIR(st.st_mode))
		rc = sl__err(-EISDIR, "%s: is a directory", path);
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
	if (S_ISREG(st.st_mode) && st.st_size > 0) {
		l->map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, l->fd, 0);
		if (l->map == MAP_FAILED)
			l->map = NULL;
		else
			l->map_len = (size_t)st.st_size;
	}
	return 0;
}

void sl__local_close(struct sl__sfile *sf)
{
	struct sl__local *l = sf->handle;

	if (!l)
		return;
	if (l->map)
		munmap(l->map, l->map_len);
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
 * Is most of [off, off+len) in the page cache?  Samples up to 64 pages of
 * the file's mapping with mincore(); costs microseconds.
 */
static int sl_resident(const struct sl__local *l, uint64_t off, size_t len)
{
	uint64_t first = off / SL_ALIGN, last = (off + len - 1) / SL_ALIGN;
	uint64_t pages = last - first + 1, step = pages > 64 ? pages / 64 : 1;
	unsigned hit = 0, tot = 0;

	if (!l->map || off + len > l->map_len)
		return 0;
	for (uint64_t p = first; p <= last; p += step) {
		unsigned char v = 0;

		if (mincore((char *)l->map + p * SL_ALIGN, SL_ALIGN, &v) == 0 && (v & 1))
			hit++;
		tot++;
	}
	return hit * 2 >= tot;
}

void sl__local_route(const struct sl__sfile *sf, const struct sl__route_ask *a, struct sl__route *r)
{
	const struct sl__local *l = sf->handle;

	r->store = sf->ops;
	r->handle = sf->handle;
	r->gpu = 0;
	if (l->dfd < 0 || a->cfg->direct == SLUICE_DIRECT_NEVER)
		r->direct = 0;
	else if (a->op == SL_IO_WRITE) /* O_DIRECT writes need an aligned start and length (or padding) */
		r->direct = !(a->off % SL_ALIGN || (a->len % SL_ALIGN && !a->pad_ok));
	else
		r->direct = a->cfg->direct == SLUICE_DIRECT_ALWAYS || !sl_resident(l, a->off, a->len);
}
