/* Small system helpers. */
#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/core.h"

int sl__mkdirs(char *path)
{
	if (!*path)
		return -ENOENT; /* as mkdir("") answers */
	for (char *p = path + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		char c = *p;

		*p = 0;
		int rc = mkdir(path, 0755) < 0 && errno != EEXIST ? -errno : 0;

		*p = c;
		if (rc || !c)
			return rc;
	}
}

const char *sl__file_kind(mode_t mode)
{
	return S_ISREG(mode) ? "regular file" : S_ISDIR(mode) ? "directory" : S_ISFIFO(mode) ? "FIFO" :
	       S_ISCHR(mode) ? "character device" : S_ISBLK(mode) ? "block device" : S_ISSOCK(mode) ? "socket" :
	       S_ISLNK(mode) ? "symbolic link" : "special file";
}

const char *sl__printable(const char *s, char *buf, size_t cap)
{
	size_t k = 0;

	for (const unsigned char *u = (const unsigned char *)s; *u && k + 5 < cap; u++)
		k += (size_t)snprintf(buf + k, cap - k, *u >= 0x20 && *u < 0x7f ? "%c" : "\\x%02x", *u);
	buf[k] = 0;
	return buf;
}

int sl__replaceable_at(int dirfd, const char *name, const char *shown)
{
	struct stat st;

	if (fstatat(dirfd, name, &st, 0) < 0)
		return errno == ENOENT ? 0 : sl__err(-errno, "%s: %s", shown, strerror(errno));
	if (S_ISREG(st.st_mode))
		return 0;
	return sl__err(S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL, "%s: exists and is not a regular file (a %s): not replaced",
		       shown, sl__file_kind(st.st_mode));
}

int sl__replaceable(const char *path)
{
	return sl__replaceable_at(AT_FDCWD, path, path);
}

/* sl__open_file's rules, of name in dirfd (shown: how errors name it). */
static int sl_open_checked(int dirfd, const char *name, int oflags, mode_t mode, const char *shown)
{
	struct stat st;
	int fd = openat(dirfd, name, oflags | O_NONBLOCK | O_CLOEXEC, mode), rc = 0, fl;

	if (fd < 0 && errno == ELOOP && (oflags & O_NOFOLLOW))
		return sl__err(-ELOOP, "%s: is a symbolic link now (it was not when it was listed): not opened", shown);
	if (fd < 0)
		return sl__err(-errno, "%s: cannot open: %s", shown, strerror(errno));
	if (fstat(fd, &st) < 0)
		rc = sl__err(-errno, "%s: fstat: %s", shown, strerror(errno));
	else if (S_ISDIR(st.st_mode))
		rc = sl__err(-EISDIR, "%s: is a directory", shown);
	else if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
		rc = sl__err(-EINVAL, "%s: is a %s, not a regular file", shown, sl__file_kind(st.st_mode));
	else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
		rc = sl__err(-errno, "%s: fcntl: %s", shown, strerror(errno));
	if (rc) {
		close(fd);
		return rc;
	}
	return fd;
}

int sl__open_file(const char *path, int oflags, mode_t mode)
{
	return sl_open_checked(AT_FDCWD, path, oflags, mode, path);
}

int sl__open_beneath(int dirfd, const char *rel, const char *shown)
{
	char *d = strdup(rel), *seg, *slash;
	int fd = dirfd, rc = 0;

	if (!d)
		return -ENOMEM;
	/* Each directory on the way entered by its own descriptor: no name is looked up twice. */
	for (seg = d; !rc && (slash = strchr(seg, '/')); seg = slash + 1) {
		int nfd;

		*slash = 0;
		if ((nfd = openat(fd, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
			struct stat st;
			int e = errno;

			/* O_NOFOLLOW with O_DIRECTORY answers a link with ENOTDIR. */
			if ((e == ELOOP || e == ENOTDIR) && fstatat(fd, seg, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
				rc = sl__err(-ELOOP, "%s: %s, a directory on its way, is a symbolic link now (it was not when "
					     "it was listed): not opened", shown, seg);
			else
				rc = sl__err(-e, "%s: %s: %s", shown, seg, strerror(e));
		}
		if (fd != dirfd)
			close(fd);
		fd = nfd;
	}
	if (!rc)
		rc = sl_open_checked(fd, seg, O_RDONLY | O_NOFOLLOW, 0, shown);
	if (fd != dirfd && fd >= 0)
		close(fd);
	free(d);
	return rc;
}

int sl__link_where(const char *root, const char *path, struct stat *st, char *real)
{
	char buf[PATH_MAX], *r = real ? real : buf;
	size_t rl = strlen(root);

	if (lstat(path, st) < 0)
		return -errno;
	if (!S_ISLNK(st->st_mode))
		return SL_LINK_NONE;
	if (stat(path, st) < 0 || !realpath(path, r))
		return errno == ELOOP ? SL_LINK_LOOP : SL_LINK_DANGLING;
	/* Inside root: root itself, or below it at a '/' ("/data" holds "/data/x", not "/database"); "/" holds all. */
	while (rl > 1 && root[rl - 1] == '/')
		rl--;
	if (rl == 1 && root[0] == '/')
		return SL_LINK_IN;
	return strncmp(r, root, rl) == 0 && (r[rl] == '/' || !r[rl]) ? SL_LINK_IN : SL_LINK_OUT;
}

void sl__link_skipped(const char *tag, int where, const char *path, const char *root_shown, const char *real,
		      const char *hint)
{
	char h[128] = "", p[1024], r[1024], t[1024];

	/* Names from the tree, printable: a link named with escape sequences must not reach a terminal as them. */
	sl__printable(path, p, sizeof(p));
	sl__printable(root_shown, r, sizeof(r));
	if (hint)
		snprintf(h, sizeof(h), " (%s takes it)", hint);
	if (where == SL_LINK_OUT)
		sl__warn(tag, "%s: links out of %s (to %s), skipped%s", p, r, sl__printable(real, t, sizeof(t)), h);
	else if (where == SL_LINK_LOOP)
		sl__warn(tag, "%s: a loop of symbolic links, skipped", p);
	else
		sl__warn(tag, "%s: a dangling link, skipped", p);
}

int sl__dirs_enter(struct sl__dirs *d, const struct stat *st)
{
	for (unsigned k = 0; k < d->n; k++)
		if (d->v[k].dev == st->st_dev && d->v[k].ino == st->st_ino)
			return 0;
	if (d->n == SL_DIRS_DEEP)
		return -ELOOP;
	d->v[d->n].dev = st->st_dev;
	d->v[d->n++].ino = st->st_ino;
	return 1;
}

void sl__dirs_leave(struct sl__dirs *d)
{
	assert(d->n > 0);
	d->n--;
}

/* A password in the userinfo is hidden, though curl still sends it. */
void sluice_url_redact(const char *url, char *out, size_t cap)
{
	const size_t end = strcspn(url, "?#"), scheme = strstr(url, "://") ? (size_t)(strstr(url, "://") - url) + 3 : 0;
	const size_t auth = scheme + strcspn(url + scheme, "/?#"); /* the authority: [userinfo@]host[:port] */
	const char *at = memchr(url + scheme, '@', auth - scheme), *colon;

	/* The last '@' of the authority ends the userinfo; its first ':' starts the password. */
	while (at && memchr(at + 1, '@', (size_t)(url + auth - at - 1)))
		at = memchr(at + 1, '@', (size_t)(url + auth - at - 1));
	if (!scheme) { /* a path: '?' and '#' are its own */
		snprintf(out, cap, "%s", url);
		return;
	}
	colon = at ? memchr(url + scheme, ':', (size_t)(at - url - (ptrdiff_t)scheme)) : NULL;
	if (colon)
		snprintf(out, cap, "%.*s:***%.*s%s", (int)(colon - url), url, (int)(end - (size_t)(at - url)), at,
			 url[end] ? "?..." : "");
	else
		snprintf(out, cap, "%.*s%s", (int)end, url, url[end] ? "?..." : "");
}

void sl__redact_urls(char *s, size_t cap)
{
	char out[4096], *o = out;
	const char *p = s, *sep;

	if (!strstr(s, "://"))
		return;
	if (cap > sizeof(out)) /* never left unredacted: a longer text is cut */
		cap = sizeof(out);
	while ((sep = strstr(p, "://"))) {
		const char *start = sep, *end = sep + 3 + strcspn(sep + 3, " \t\n");
		char url[4096];

		while (start > p && (isalnum((unsigned char)start[-1]) || strchr("+.-", start[-1])))
			start--;
		while (start < sep && !isalpha((unsigned char)*start))
			start++;
		/* Punctuation that closes the sentence is not the URL's. */
		while (end > sep + 3 && strchr(":,;)]'\"", end[-1]))
			end--;
		if (start == sep) { /* "://" with no scheme: not a URL */
			end = sep + 3;
			start = end;
		}
		snprintf(url, sizeof(url), "%.*s", (int)(end - start), start);
		snprintf(o, (size_t)(out + cap - o), "%.*s", (int)(start - p), p);
		o += strlen(o);
		if (o >= out + cap - 1)
			break;
		if (*url)
			sluice_url_redact(url, o, (size_t)(out + cap - o));
		o += strlen(o);
		p = end;
	}
	if (o < out + cap - 1)
		snprintf(o, (size_t)(out + cap - o), "%s", p);
	memcpy(s, out, cap);
	s[cap - 1] = '\0';
}

/* ---- Temporaries of writes replaced by a rename ---- */

static void sl_tmp_host(char host[64])
{
	snprintf(host, 64, "host");
	gethostname(host, 63);
	host[63] = 0;
	if (!host[0])
		snprintf(host, 64, "host");
	for (char *h = host; *h; h++)
		if (*h == '/' || *h == '-')
			*h = '_';
}

/* Those of base in dfd left by a writer of this host that is gone, and of this user. */
static void sl_tmp_reclaim(int dfd, const char *shown, const char *base, const char *host)
{
	char prefix[512];
	size_t pl = (size_t)snprintf(prefix, sizeof(prefix), ".%s.sluice-tmp-%s-", base, host);
	int fd = pl < sizeof(prefix) ? openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (fd >= 0 && !d)
		close(fd);
	while (d && (e = readdir(d))) {
		struct stat st;
		char *end;
		long pid;

		if (strncmp(e->d_name, prefix, pl) || (pid = strtol(e->d_name + pl, &end, 10)) <= 0 || *end != '-' ||
		    !(kill((pid_t)pid, 0) < 0 && errno == ESRCH) ||
		    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_uid != geteuid())
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0)
			sl__info("core", "%s%s%s: removed, its writer (process %ld) is gone", shown, *shown ? "/" : "",
				 e->d_name, pid);
	}
	if (d)
		closedir(d);
}

int sl__tmp_open(int dirfd, const char *dir, const char *base, mode_t mode, const char *link, char **tmp)
{
	static _Atomic unsigned seq;
	const int sub = dir && *dir;
	char host[64];
	int dfd = sub ? openat(dirfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : dirfd, fd = -EEXIST;

	*tmp = NULL;
	if (dfd < 0 && dfd != AT_FDCWD)
		return -errno;
	sl_tmp_host(host);
	sl_tmp_reclaim(dfd, sub ? dir : "", base, host);
	for (int tries = 0; fd == -EEXIST && tries < 100; tries++) {
		free(*tmp);
		if (asprintf(tmp, "%s%s.%s.sluice-tmp-%s-%d-%u", sub ? dir : "", sub ? "/" : "", base, host, (int)getpid(),
			     atomic_fetch_add(&seq, 1)) < 0) {
			*tmp = NULL;
			fd = -ENOMEM;
			break;
		}
		if (link)
			fd = symlinkat(link, dirfd, *tmp) < 0 ? -errno : 0;
		else if ((fd = openat(dirfd, *tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)) < 0)
			fd = -errno;
	}
	if (sub)
		close(dfd);
	if (fd < 0) {
		free(*tmp);
		*tmp = NULL;
	}
	return fd;
}

int sluice_drop_page_cache(void)
{
	int fd, ok;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ok = write(fd, "3", 1) == 1;
	close(fd);
	return ok;
}

/*
 * cachestat(2) (Linux 6.5): the pages of [off, off+len) in the page cache,
 * in one call and with no mapping; -errno where the kernel or the
 * filesystem does not answer it.  The headers of older distributions lack
 * its number, the same on x86-64 and arm64.
 */
#if !defined(__NR_cachestat) && (defined(__x86_64__) || defined(__aarch64__))
#define __NR_cachestat 451
#endif

int sl__test_no_cachestat;

/* The pages of [off, off+len) cached, and *dirty (or NULL) those dirty or under writeback; -errno. */
static int64_t sl_cachestat(int fd, uint64_t off, uint64_t len, uint64_t *dirty)
{
	if (sl__test_no_cachestat)
		return -ENOSYS;
#ifdef __NR_cachestat
	struct { uint64_t off, len; } range = { off, len };
	struct { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; } cs;

	if (syscall(__NR_cachestat, fd, &range, &cs, 0) < 0)
		return -errno;
	if (dirty)
		*dirty = cs.nr_dirty + cs.nr_writeback;
	return (int64_t)cs.nr_cache;
#else
	(void)fd, (void)off, (void)len, (void)dirty;
	return -ENOSYS;
#endif
}

int64_t sl__cachestat(int fd, uint64_t off, uint64_t len)
{
	return sl_cachestat(fd, off, len, NULL);
}

/*
 * The bytes of fd's size bytes in the page cache: cachestat, else mincore
 * over the file mapped a GiB at a time (mapping touches no page).  -errno
 * where neither answers.
 */
static int64_t sl_cached_bytes(int fd, uint64_t size, int *by_mincore)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), win = 1ull << 30;
	int64_t n = size ? sl_cachestat(fd, 0, size, NULL) : 0;
	unsigned char *vec;
	uint64_t got = 0;

	*by_mincore = n < 0;
	if (n >= 0)
		return n * (int64_t)page;
	if (!(vec = malloc(win / page)))
		return -ENOMEM;
	for (uint64_t off = 0; off < size; off += win) {
		size_t len = (size_t)(size - off < win ? size - off : win), pages = (len + page - 1) / page;
		void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);

		if (m == MAP_FAILED || mincore(m, len, vec) < 0) {
			n = -errno;
			if (m != MAP_FAILED)
				munmap(m, len);
			free(vec);
			return n;
		}
		for (size_t i = 0; i < pages; i++)
			got += vec[i] & 1;
		munmap(m, len);
	}
	free(vec);
	return (int64_t)(got * page);
}

int sl__page_cache_evict(int fd, const char *shown, uint64_t *cached, char *why, size_t cap)
{
	struct statfs fs;
	struct stat st;
	uint64_t dirty = 0;
	int64_t left = -1;
	int e, by_mincore = 0;

	if (cached)
		*cached = 0;
	if (why && cap)
		why[0] = 0;
	if (fstat(fd, &st) < 0)
		return sl__err(-errno, "%s: %s", shown, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return sl__err(-EINVAL, "%s: is a %s, not a regular file", shown, sl__file_kind(st.st_mode));
	/* Nothing cached: nothing to do (a sync each of a tree's many files would cost a journal commit each). */
	if (st.st_size && (left = sl_cachestat(fd, 0, (uint64_t)st.st_size, &dirty)) == 0)
		return 0;
	/* Dirty pages are not dropped: written back first, they are clean, and go. */
	if ((left < 0 || dirty) && fdatasync(fd) < 0 && errno != EINVAL && errno != EROFS)
		return sl__err(-errno, "%s: fdatasync: %s", shown, strerror(errno));
	/*
	 * A page another thread holds for a moment (a reader's, one in a CPU's
	 * batch on its way to the LRU) is skipped: a few tries before what
	 * stays is called staying.
	 */
	for (int tries = 0; tries < 3 && left != 0; tries++) {
		if ((e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)))
			return sl__err(-e, "%s: posix_fadvise(POSIX_FADV_DONTNEED): %s", shown, strerror(e));
		left = sl_cached_bytes(fd, (uint64_t)st.st_size, &by_mincore);
		if (left > 0 && tries < 2)
			usleep(1000);
	}
	/*
	 * Before cachestat (Linux 6.5), mincore tells only the owner of a file,
	 * or one who may write it, what of it is cached; to others it shows the
	 * pages they map.  Then nothing seen is not counted as nothing there.
	 */
	if (left == 0 && by_mincore && st.st_uid != geteuid() && geteuid() != 0 && faccessat(AT_FDCWD, shown, W_OK, AT_EACCESS))
		left = -EPERM;
	if (left > 0 && cached)
		*cached = (uint64_t)left;
	if (!why || !cap || left == 0)
		return 0;
	if (left < 0)
		snprintf(why, cap, "what stayed in the page cache could not be counted (%s)",
			 left == -EPERM ? "mincore tells only a file's owner or writer, cachestat needs Linux 6.5"
					: strerror((int)-left));
	else if (fstatfs(fd, &fs) == 0 && (fs.f_type == 0x01021994 /* TMPFS_MAGIC */ || fs.f_type == 0x858458f6 /* RAMFS */))
		snprintf(why, cap, "it is on tmpfs, whose files live in the page cache alone: there is no storage to read "
			 "them from cold");
	else
		snprintf(why, cap, "its pages mapped or locked by a process (this one or another) stay in the page cache");
	return 0;
}

/*
 * Machine facts, read in one place so that `sluice doctor` and the engine
 * cannot disagree; under SLUICE_SYSROOT where set (tests give a fake /proc
 * and /sys).
 */
const char *sl__sysroot(void)
{
	const char *r = getenv("SLUICE_SYSROOT"); /* the environment's alone (settings.c) */

	return r && strcmp(r, "/") ? r : "";
}

int sl__sys_vread(char *buf, size_t cap, const char *fmt, va_list ap)
{
	char rel[4096], p[8192];
	FILE *f;
	size_t n;

	vsnprintf(rel, sizeof(rel), fmt, ap);
	snprintf(p, sizeof(p), "%s%s", sl__sysroot(), rel);
	if (!(f = fopen(p, "re")))
		return -errno;
	n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		buf[--n] = 0;
	return 0;
}

int sl__sys_read(char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = sl__sys_vread(buf, cap, fmt, ap);
	va_end(ap);
	return rc;
}

int sl__nvfs_loaded(void)
{
	char v[256];

	return !sl__sys_read(v, sizeof(v), "/proc/driver/nvidia-fs/version") ||
	       !sl__sys_read(v, sizeof(v), "/sys/module/nvidia_fs/version");
}

int sl__memlock(uint64_t *soft, int *unlimited, int *ipc_lock)
{
	char lim[16384], st[8192];
	const char *l, *cap;

	*soft = 0;
	*unlimited = *ipc_lock = 0;
	if (sl__sys_read(lim, sizeof(lim), "/proc/self/limits") || !(l = strstr(lim, "Max locked memory")))
		return -ENOENT;
	if (!sl__sys_read(st, sizeof(st), "/proc/self/status") && (cap = strstr(st, "CapEff:")))
		*ipc_lock = (int)((strtoull(cap + 7, NULL, 16) >> 14) & 1); /* CAP_IPC_LOCK is bit 14 */
	l += 17;
	l += strspn(l, " ");
	if (!strncmp(l, "unlimited", 9))
		*unlimited = 1;
	else
		*soft = strtoull(l, NULL, 10);
	return 0;
}

static int sl_hexdigit(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int sl__pct_byte(const char *p, size_t n)
{
	int hi = n >= 3 && p[0] == '%' ? sl_hexdigit(p[1]) : -1, lo = hi >= 0 ? sl_hexdigit(p[2]) : -1;

	return lo < 0 ? -1 : hi << 4 | lo;
}

/*
 * Appends s to out (cap bytes at out, l used), percent-encoding all but
 * unreserved characters and, where slash is set (keys), '/'.  Returns the
 * new length, 0 if it does not fit.
 */
size_t sl__url_encode(char *out, size_t cap, size_t l, const char *s, int slash)
{
	static const char hex[] = "0123456789ABCDEF";

	for (; *s && l + 4 < cap; s++) {
		unsigned char ch = (unsigned char)*s;

		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
		    ch == '_' || ch == '.' || ch == '~' || (ch == '/' && slash)) {
			out[l++] = (char)ch;
		} else {
			out[l++] = '%';
			out[l++] = hex[ch >> 4];
			out[l++] = hex[ch & 15];
		}
	}
	out[l] = 0;
	return *s ? 0 : l;
}
