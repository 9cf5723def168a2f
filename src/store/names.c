/*
 * Paths that are local or s3:// URLs, for the dataset readers (remote.h):
 * an object is a regular file, a prefix with keys below it a directory,
 * and a file is opened through its cached copy.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "remote/remote.h"

int sl__fs_stat(const char *path, struct stat *st)
{
	char bucket[64], key[1025], dir[1100];
	struct sl__s3 *s3;
	struct sl__http_conn *c;
	struct sl__s3_list l = { 0 };
	struct sl__s3_meta m;
	int rc;

	memset(st, 0, sizeof(*st));
	if (!sl__is_s3_url(path))
		return stat(path, st) < 0 ? -errno : 0;
	if ((rc = sl__s3_parse_url(path, bucket, sizeof(bucket), key, sizeof(key))) || (rc = sl__s3_default(&s3)))
		return rc;
	if (!(c = sl__http_thread_conn()))
		return -ENOMEM;
	if (key[0] && key[strlen(key) - 1] != '/') {
		rc = sl__s3_head(s3, c, bucket, key, &m);
		if (!rc) {
			st->st_mode = S_IFREG | 0444;
			st->st_size = (off_t)m.size;
			return 0;
		}
		if (rc != -ENOENT)
			return rc;
	}
	snprintf(dir, sizeof(dir), "%s%s", key, key[0] && key[strlen(key) - 1] != '/' ? "/" : "");
	rc = sl__s3_list(s3, c, bucket, dir, "/", 1, &l); /* one entry says it is a directory */
	if (!rc && !l.n)
		rc = sl__err(-ENOENT, "%s: no such object or prefix", path);
	if (!rc)
		st->st_mode = S_IFDIR | 0555;
	sl__s3_list_free(&l);
	return rc;
}

static int sl_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends A/B (A and B joined by sep) to names. */
static int sl_add(char ***names, unsigned *n, size_t *cap, const char *a, const char *sep, const char *b)
{
	if (sl__reserve(names, cap, (*n + 1) * sizeof(char *)) ||
	    asprintf(&(*names)[*n], "%s%s%s", a, sep, b) < 0)
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* The regular files of local directory dir (and, with recursive, of every directory below it) appended. */
static int sl_list_local(const char *dir, int recursive, char ***names, unsigned *n, size_t *cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int rc = 0;

	if (!d)
		return sl__err(-errno, "%s: %s", dir, strerror(errno));
	while (!rc && (e = readdir(d))) {
		struct stat st;
		char *p = NULL;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || asprintf(&p, "%s/%s", dir, e->d_name) < 0)
			continue;
		if (lstat(p, &st) == 0 && S_ISREG(st.st_mode))
			rc = sl_add(names, n, cap, dir, "/", e->d_name);
		else if (recursive && S_ISDIR(st.st_mode))
			rc = sl_list_local(p, 1, names, n, cap);
		free(p);
	}
	closedir(d);
	return rc;
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

int sl__fs_list(const char *dir, int recursive, char ***names, unsigned *n)
{
	size_t cap = 0;
	int rc = 0;

	*names = NULL;
	*n = 0;
	if (!sl__is_s3_url(dir)) {
		rc = sl_list_local(dir, recursive, names, n, &cap);
	} else {
		char bucket[64], key[1025];
		struct sl__s3 *s3;
		struct sl__http_conn *c = sl__http_thread_conn();
		struct sl__s3_list l = { 0 };
		size_t kl;

		if ((rc = sl__s3_parse_url(dir, bucket, sizeof(bucket), key, sizeof(key))) || (rc = sl__s3_default(&s3)))
			return rc;
		kl = strlen(key);
		if (kl && key[kl - 1] != '/' && kl + 1 < sizeof(key))
			key[kl++] = '/', key[kl] = 0;
		rc = c ? sl__s3_list(s3, c, bucket, key, recursive ? NULL : "/", 0, &l) : -ENOMEM;
		/* Objects only: not the prefixes, nor "directory" markers (keys ending in '/'). */
		for (size_t i = 0; !rc && i < l.n; i++)
			if (!l.e[i].is_prefix && strlen(l.e[i].key) > kl && l.e[i].key[strlen(l.e[i].key) - 1] != '/')
				rc = sl_add(names, n, &cap, dir, dir[strlen(dir) - 1] != '/' ? "/" : "", l.e[i].key + kl);
		sl__s3_list_free(&l);
	}
	if (rc) {
		sluice_list_free(*names, *n);
		*names = NULL;
		*n = 0;
		return rc;
	}
	if (*n)
		qsort(*names, *n, sizeof(char *), sl_cmp);
	return 0;
}

int sl__fs_local(const char *path, char *local, size_t cap)
{
	if (sl__is_s3_url(path))
		return sl__cache_fetch(path, local, cap);
	if ((size_t)snprintf(local, cap, "%s", path) >= cap)
		return sl__err(-ENAMETOOLONG, "%s: path too long", path);
	return 0;
}

int sl__fs_upload(const char *local, const char *url)
{
	char bucket[64], key[1025];
	struct sl__s3 *s3;
	struct stat st;
	void *m = NULL;
	int fd, rc;

	if ((rc = sl__s3_parse_url(url, bucket, sizeof(bucket), key, sizeof(key))) || (rc = sl__s3_default(&s3)))
		return rc;
	if (!key[0] || key[strlen(key) - 1] == '/')
		return sl__err(-EISDIR, "%s: names a prefix, not an object", url);
	if ((fd = sl__open_file(local, O_RDONLY, 0)) < 0)
		return fd;
	if (fstat(fd, &st) < 0)
		rc = sl__err(-errno, "%s: %s", local, strerror(errno));
	else if (st.st_size && (m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
		rc = sl__err(-errno, "%s: mmap: %s", local, strerror(errno)), m = NULL;
	close(fd);
	if (!rc) {
		if (m)
			madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
		rc = sl__s3_upload(s3, bucket, key, m ? m : "", (size_t)st.st_size, NULL, NULL);
	}
	if (m)
		munmap(m, (size_t)st.st_size);
	return rc;
}

int sl__fs_download(const char *url, int dirfd, const char *name, const char *shown, int *verified, char sum_name[48])
{
	char bucket[64], key[1025], *tmp = NULL;
	struct sl__s3 *s3;
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl__s3_meta m;
	int fd, rc;

	if ((rc = sl__s3_parse_url(url, bucket, sizeof(bucket), key, sizeof(key))) || (rc = sl__s3_default(&s3)))
		return rc;
	if (!c)
		return -ENOMEM;
	if ((rc = sl__s3_head(s3, c, bucket, key, &m)))
		return rc;
	if (sum_name)
		snprintf(sum_name, 48, "%s", m.sum_name[0] ? m.sum_name : "none (no checksum)");
	if ((rc = sl__replaceable_at(dirfd, name, shown)))
		return rc;
	if (asprintf(&tmp, "%s.sluice-part.%d", name, (int)getpid()) < 0)
		return -ENOMEM;
	/* Read back for a one-pass checksum; O_EXCL: a file of our own, never one linked (hard or soft) there. */
	unlinkat(dirfd, tmp, 0); /* a killed download's of this pid, or a name planted there: made anew */
	fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = sl__err(-errno, "%s.sluice-part.%d: %s", shown, (int)getpid(), strerror(errno));
		free(tmp);
		return rc;
	}
	rc = sl__s3_download(s3, bucket, key, &m, fd, NULL, verified);
	if (close(fd) < 0 && !rc)
		rc = sl__err(-errno, "%s: %s", shown, strerror(errno));
	if (!rc && renameat(dirfd, tmp, dirfd, name) < 0)
		rc = sl__err(-errno, "%s: %s", shown, strerror(errno));
	if (rc)
		unlinkat(dirfd, tmp, 0);
	free(tmp);
	return rc;
}

int sluice_remove(const char *path)
{
	return sl__fs_remove(path);
}

int sl__fs_remove(const char *path)
{
	char bucket[64], key[1025];
	struct sl__s3 *s3;
	struct sl__http_conn *c = sl__http_thread_conn();
	int rc;

	if (!sl__is_s3_url(path))
		return unlink(path) < 0 ? sl__err(-errno, "%s: %s", path, strerror(errno)) : 0;
	if ((rc = sl__s3_parse_url(path, bucket, sizeof(bucket), key, sizeof(key))) || (rc = sl__s3_default(&s3)))
		return rc;
	return c ? sl__s3_delete(s3, c, bucket, key) : -ENOMEM;
}
