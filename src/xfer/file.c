/*
 * Files and the synchronous transfer calls, including the durable,
 * atomic whole-file write.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xfer/xfer.h"

int sluice_file_open(struct sluice_file **out, struct sluice_engine *eng, const char *path,
		     int flags)
{
	return sl__file_open(out, eng, NULL, path, flags);
}

/* -EROFS naming the path (any credential in it hidden) and its store. */
static int sl_refuse_write(const char *path, const struct sl__store *st)
{
	char name[512];

	sluice_url_redact(path, name, sizeof(name));
	return sl__err(-EROFS, "%s: the %s store does not write (its files open read-only)", name, st->name);
}

int sl__file_open(struct sluice_file **out, struct sluice_engine *eng, void *arg, const char *path, int flags)
{
	const struct sl__store *st;
	struct sl__open_env env;
	struct sluice_file *f;
	int rc;

	*out = NULL;
	sl__err_clear();
	if ((rc = sl__store_for(eng, path, &st)))
		return rc;
	if ((flags & SLUICE_RDWR) && (st->caps & SL_STORE_READONLY))
		return sl_refuse_write(path, st);
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->eng = eng;
	f->index = -1;
	f->writable = !!(flags & SLUICE_RDWR);
	f->path = strdup(path);
	if (!f->path) {
		free(f);
		return -ENOMEM;
	}
	sl__open_env(eng, st, arg, &env);
	rc = st->open(&f->s, path, flags, &env);
	if (rc) {
		free(f->path);
		free(f);
		return rc;
	}
	f->s.ops = st;
	if (f->s.shown) {
		free(f->path);
		if (!(f->path = strdup(f->s.shown))) {
			sluice_file_close(f);
			return -ENOMEM;
		}
	}
	if ((rc = sl__eng_file_add(eng, f))) {
		sluice_file_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

void sluice_file_close(struct sluice_file *f)
{
	if (!f)
		return;
	sl__eng_file_remove(f->eng, f);
	f->s.ops->close(&f->s);
	free(f->path);
	free(f);
}

uint64_t sluice_file_size(const struct sluice_file *f)
{
	return atomic_load(&((struct sluice_file *)f)->s.size);
}

int sluice_file_direct_ok(const struct sluice_file *f)
{
	return f->s.direct_ok;
}

int sluice_file_sync(struct sluice_file *f)
{
	/* A file of a store without sync (an object opened read-only) has nothing to make durable. */
	return f->s.ops->sync ? f->s.ops->sync(&f->s, f->path) : 0;
}

ssize_t sluice_read_batch(struct sluice_engine *eng, const struct sluice_range *r, size_t n,
			  struct sluice_xfer_report *rep)
{
	return sl__transfer(eng, SL_IO_READ, r, n, rep);
}

ssize_t sluice_write_batch(struct sluice_engine *eng, const struct sluice_range *r, size_t n,
			   struct sluice_xfer_report *rep)
{
	ssize_t rc = sl__transfer(eng, SL_IO_WRITE, r, n, rep);
	int frc;

	if (rc < 0)
		return rc;
	frc = sl__fix_size(r, n);
	return frc ? frc : rc;
}

ssize_t sluice_file_read(struct sluice_file *f, uint64_t offset, size_t len, void *dst,
			 struct sluice_xfer_report *rep)
{
	struct sluice_range r = { f, offset, len, dst };

	return sluice_read_batch(f->eng, &r, 1, rep);
}

ssize_t sluice_file_write(struct sluice_file *f, uint64_t offset, size_t len, const void *src,
			  struct sluice_xfer_report *rep)
{
	struct sluice_range r = { f, offset, len, (void *)src };

	return sluice_write_batch(f->eng, &r, 1, rep);
}

ssize_t sluice_read_to_gpu(struct sluice_engine *eng, const char *path, uint64_t offset,
			   size_t len, void *dst, struct sluice_xfer_report *rep)
{
	struct sluice_file *f;
	ssize_t rc = sluice_file_open(&f, eng, path, SLUICE_RDONLY);

	if (rc)
		return rc;
	rc = sluice_file_read(f, offset, len, dst, rep);
	sluice_file_close(f);
	return rc;
}

/* A part of a whole-file write from GPU memory: copied to the store's host buffer first. */
static int sl_copy_from_gpu(void *eng, void *dst, const void *src, size_t n)
{
	return sluice_gpu_copy(eng, dst, src, n);
}

ssize_t sl__write_whole(struct sluice_engine *eng, void *arg, const char *path, const void *src, size_t len,
			struct sluice_xfer_report *rep)
{
	const struct sl__store *st;
	uint64_t t0 = sl__now_ns();
	int rc = sl__store_for(eng, path, &st), gpu = sluice_is_gpu_ptr(eng, src);
	struct sl__open_env env;

	if (!rc)
		rc = SL_REPORT_IN(rep, xfer_report);
	if (rc)
		return rc;
	if (!st->put)
		return sl_refuse_write(path, st);
	sl__open_env(eng, st, arg, &env);
	rc = st->put(path, src, len, gpu ? sl_copy_from_gpu : NULL, eng, &env);
	if (rc)
		return rc;
	if (rep) {
		rep->bytes = rep->bytes_buffered = len;
		if (SL_COVERS(rep, bytes_storage))
			rep->bytes_storage = len;
		rep->seconds = (double)(sl__now_ns() - t0) / 1e9;
		snprintf(rep->path, sizeof(rep->path), "%s>%s:upload", gpu ? "gpu>host" : "host", st->name);
	}
	return (ssize_t)len;
}

/*
 * The temporary of a write of len bytes to path: made beside it in dir (so
 * rename() stays in one filesystem), with the mode path has (a new file:
 * what open(2) gives under the umask), its space reserved (ENOSPC now,
 * not half-way through).  Its descriptor, or an error; *tmp its name.
 */
static int sl_open_tmp(const char *path, const char *dir, const char *base, size_t len, char **tmp)
{
	struct stat st;
	int keep_mode = stat(path, &st) == 0, fd, e;

	if ((e = sl__replaceable(path)))
		return e;
	/* Its mode: open(2)'s 0666 under the process's umask, applied by the kernel (umask(2) would change it for every thread). */
	if ((fd = sl__tmp_open(AT_FDCWD, dir, base, 0666, NULL, tmp)) < 0)
		return sl__err(fd, "%s: cannot create temporary file in %s: %s", path, dir, strerror(-fd));
	if (keep_mode && fchmod(fd, st.st_mode & 07777) < 0)
		e = sl__err(-errno, "%s: fchmod: %s", *tmp, strerror(errno));
	else if (len && (e = posix_fallocate(fd, 0, (off_t)sl__align_up(len, SL_ALIGN))) && e != EOPNOTSUPP && e != EINVAL)
		e = sl__err(-e, "%s: cannot reserve %zu bytes for %s: %s", dir, len, path, strerror(e));
	else
		e = 0;
	if (e) {
		close(fd);
		return e;
	}
	return fd;
}

/* The temporary, complete and synced, renamed over path, and the rename made durable (the directory synced). */
static int sl_commit_tmp(const char *tmp, const char *path, const char *dir)
{
	int dfd, rc = 0;

	if (rename(tmp, path) < 0)
		return sl__err(-errno, "%s: rename from %s: %s", path, tmp, strerror(errno));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd) < 0)
		rc = sl__err(-errno, "%s: fsync of directory %s: %s", path, dir, strerror(errno));
	if (dfd >= 0)
		close(dfd);
	return rc;
}

ssize_t sluice_write_from_gpu(struct sluice_engine *eng, const char *path, const void *src,
			      size_t len, struct sluice_xfer_report *rep)
{
	char *dup1, *dup2, *tmp = NULL;
	const char *dir = NULL;
	struct sluice_file *f = NULL;
	const struct sl__store *store;
	ssize_t rc;
	int fd = -1;

	/* Objects are written whole by their store (an upload); files through a temporary, renamed. */
	if ((rc = sl__store_for(eng, path, &store)))
		return rc;
	if (store->caps & SL_STORE_READONLY)
		return sl__write_whole(eng, NULL, path, src, len, rep);
	if ((rc = SL_REPORT_IN(rep, xfer_report)))
		return rc;
	dup1 = strdup(path);
	dup2 = strdup(path);
	if (!dup1 || !dup2)
		rc = -ENOMEM;
	else if ((fd = sl_open_tmp(path, dir = dirname(dup1), basename(dup2), len, &tmp)) < 0)
		rc = fd;
	else if (!(rc = sluice_file_open(&f, eng, tmp, SLUICE_RDWR)) && (rc = sluice_file_write(f, 0, len, src, rep)) >= 0 &&
		 !(rc = f->s.ops->truncate(&f->s, tmp, len)) && !(rc = f->s.ops->sync(&f->s, tmp)) &&
		 !(rc = sl_commit_tmp(tmp, path, dir))) {
		free(tmp);
		tmp = NULL; /* renamed: nothing to clean up any more */
		rc = (ssize_t)len;
	}
	sluice_file_close(f);
	if (fd >= 0)
		close(fd);
	if (tmp) {
		unlink(tmp);
		free(tmp);
	}
	free(dup1);
	free(dup2);
	return rc;
}
