/*
 * sluice_copy (sluice.h): files between any two stores (local paths,
 * s3://, http(s)://), one or a whole tree, several files at once.  Into a
 * local destination, the source store's fetch (checked against the file's
 * checksum where it has one); into a remote one, its put: from the local
 * file, or from a copy fetched into the cache's staging directory first.
 * A local tree is walked as pack --from-dir walks one (local.c's
 * sl__local_tree): links out of it skipped and named, each file opened
 * beneath the tree's directory with no link followed on the way, and
 * checked to be the one listed.  Progress, where asked, is told from a
 * thread of its own by what the files underway have written or read.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/names.h"
#include "store/store.h"

enum { SL_FILES_AT_ONCE = 4, SL_TELL_MS = 250 };

struct sl_pair {
	char *src, *dst;
	size_t below; /* dst[below..]: the name from the source (a key's rest), no link followed in it */
	char *real;   /* a local tree's file: its real path below the tree (absolute: outside it, -L); else NULL */
	char *link;   /* SLUICE_COPY_LINKS: the link to make (its target), not a file; else NULL */
	dev_t dev;    /* a local tree's file as listed: what its open must find */
	ino_t ino;
};

/* One of the files underway, as the progress thread sees it. */
struct sl_slot {
	struct sl__fs_watch w;
	_Atomic uint64_t size;    /* its bytes, where known (0: not) */
	_Atomic int through;      /* remote to remote: fetched, then put, each half of its bytes' way */
	_Atomic uint64_t fetched; /* remote to remote: the bytes fetched, once they all are */
};

struct sl_copy {
	struct sl_pair *p;
	size_t n, cap;
	int src_local, dst_local;
	int src_url, dst_url;       /* the store names files by URL-encoded paths (store.h's SL_STORE_URL_NAMES) */
	const char *tree, *tree_dst, *tree_sep; /* a local tree: its name, and where its files go */
	int rootfd, slashfd;        /* a local tree: its directory, and "/" for files outside it (-L); else -1 */
	uint64_t skipped;           /* a local tree's entries left out */
	uint64_t total;             /* every file's bytes; 0 where the source's listing does not say */
	_Atomic uint64_t bytes;     /* of the files done */
	_Atomic size_t next;
	_Atomic uint64_t files_done;
	_Atomic unsigned slots_taken;
	struct sl_slot slot[SL_FILES_AT_ONCE];
	void (*progress)(uint64_t bytes, uint64_t total, uint64_t files_done, uint64_t files, void *arg);
	void *progress_arg;
	uint64_t told;              /* the last bytes told: never less the next time */
	pthread_mutex_t tell_lock;  /* over: */
	pthread_cond_t tell_cond;
	int stop;
	_Atomic uint64_t verified;  /* downloads checked against their object's checksum */
	pthread_mutex_t lock;       /* over what: */
	char what[64];              /* the algorithms verified, joined by ", " */
	char why_not[48];           /* why the first download not verified was not ("" none) */
	struct sl__first_err fail;
};

/* One download's checksum (its name, and whether it was matched) into c's summary. */
/* Whether the list "a, b, c" holds name as one of its entries (not inside another: crc32 in crc32c). */
static int sl_listed(const char *list, const char *name)
{
	const size_t n = strlen(name);

	for (const char *p = list; (p = strstr(p, name)); p += n)
		if ((p == list || p[-1] == ' ') && (!p[n] || p[n] == ','))
			return 1;
	return 0;
}

static void sl_copy_note(struct sl_copy *c, int ok, const char *name)
{
	size_t l;

	pthread_mutex_lock(&c->lock);
	l = strlen(c->what);
	if (!ok && !c->why_not[0])
		snprintf(c->why_not, sizeof(c->why_not), "%s", name);
	else if (ok && !sl_listed(c->what, name) && l + strlen(name) + 3 < sizeof(c->what))
		snprintf(c->what + l, sizeof(c->what) - l, "%s%s", l ? ", " : "", name);
	pthread_mutex_unlock(&c->lock);
}

/*
 * rel as the destination names it (malloc'd): a name of a URL-named store
 * (a web listing's link) decoded for a store of plain names; a plain name
 * (a local file's, a key) encoded for a URL-named one, each byte but
 * letters, digits, "-._~" and the '/' between segments as %XX, so that
 * the server decodes it back to that name and nothing else (a literal
 * "%2e%2e" stays a name, never a dot segment).
 */
static char *sl_rel_for(const struct sl_copy *c, const char *rel)
{
	size_t n = strlen(rel), k = 0;
	char *out = malloc(3 * n + 1);

	for (size_t i = 0; out && i < n; i++) {
		unsigned char b = (unsigned char)rel[i];
		int v;

		if (c->src_url && !c->dst_url && (v = sl__pct_byte(rel + i, n - i)) >= 0) {
			out[k++] = (char)v;
			i += 2;
		} else if (!c->src_url && c->dst_url && !(isalnum(b) || strchr("-._~/", b))) {
			k += (size_t)snprintf(out + k, 4, "%%%02X", b);
		} else {
			out[k++] = (char)b;
		}
	}
	if (out)
		out[k] = 0;
	return out;
}

static int sl_rel_escapes(const char *rel);

static int sl_copy_add(struct sl_copy *c, const char *src, const char *dst_dir, const char *sep, const char *rel)
{
	struct sl_pair *q;
	char *name = sl_rel_for(c, rel);
	int rc = name ? 0 : -ENOMEM;

	/*
	 * A decoded name checked again: it must still be one below the destination.  A backslash is an ordinary byte of
	 * a Linux name (a listing's %5C), not a separator.
	 */
	if (!rc && *name && c->src_url && !c->dst_url && sl_rel_escapes(name))
		rc = sl__err(-EINVAL, "%s: its name would put its copy outside %s; nothing was copied", src, dst_dir);
	if (!rc && sl__reserve(&c->p, &c->cap, (c->n + 1) * sizeof(*c->p)))
		rc = -ENOMEM;
	if (rc) {
		free(name);
		return rc;
	}
	q = &c->p[c->n];
	memset(q, 0, sizeof(*q)); /* the fields past src and dst are 0 unless the caller sets them */
	q->src = strdup(src);
	q->below = strlen(dst_dir) + strlen(sep);
	if (!q->src || asprintf(&q->dst, "%s%s%s", dst_dir, sep, name) < 0) {
		free(q->src);
		free(name);
		return -ENOMEM;
	}
	free(name);
	c->n++;
	return 0;
}

/*
 * mkdir -p of a download's parent directory.  Below the destination the
 * user named (q->below), each directory is made and entered with openat
 * O_NOFOLLOW: a symbolic link there (already in the destination, or put
 * there while the copy runs) would send the copy outside it, so it is
 * refused, naming the key and the link.  The last name may be a link to a
 * file: the download's rename replaces the link, not what it leads to.
 * *dirfd and *name: where the download goes, the last directory entered
 * (so the file is written through it, not by a path that a link swapped
 * in meanwhile could redirect), or AT_FDCWD and the whole path.
 */
static int sl_parents(const struct sl_pair *q, int *dirfd, const char **name)
{
	char *d = strdup(q->dst), *p;
	/* Names from the source have segments only in a tree's copy, where dst[below - 1] is a '/'. */
	const int walk = strchr(q->dst + q->below, '/') != NULL;
	int rc = 0, dfd = -1;

	if (!d)
		return -ENOMEM;
	for (p = d + 1; !rc && (p = strchr(p, '/')) && (!walk || (size_t)(p - d) < q->below); p++) {
		*p = 0;
		if (mkdir(d, 0755) < 0 && errno != EEXIST)
			rc = sl__err(-errno, "%s: %s", d, strerror(errno));
		*p = '/';
	}
	if (!rc && walk) {
		d[q->below - 1] = 0;
		if ((dfd = open(*d ? d : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			rc = sl__err(-errno, "%s: %s", d, strerror(errno));
		d[q->below - 1] = '/';
	}
	for (char *seg = d + q->below; !rc && dfd >= 0 && (p = strchr(seg, '/')); seg = p + 1) {
		int nfd;

		*p = 0;
		if (mkdirat(dfd, seg, 0755) < 0 && errno != EEXIST)
			rc = sl__err(-errno, "%s: %s", d, strerror(errno));
		else if ((nfd = openat(dfd, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
			struct stat st;
			int e = errno, link = fstatat(dfd, seg, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);

			rc = link ? sl__err(-ELOOP, "%s: not copied: %s is a symbolic link, and a copy never writes through "
					    "one inside its destination", q->src, d)
				  : sl__err(-e, "%s: not copied: %s: %s", q->src, d, strerror(e));
		} else {
			close(dfd);
			dfd = nfd;
		}
		*p = '/';
	}
	*dirfd = AT_FDCWD;
	*name = q->dst;
	if (!rc && dfd >= 0) {
		*dirfd = dfd;
		*name = strrchr(q->dst, '/') + 1;
	} else if (dfd >= 0) {
		close(dfd);
	}
	free(d);
	return rc;
}

/* q's source fetched into the staging directory, then put as q's destination. */
static int sl_copy_through(const struct sl_pair *q, struct sl_slot *sl, uint64_t *bytes)
{
	char stage[4096] = "", *tmp = NULL;
	struct stat st;
	int rc = sl__fs_staging(stage, sizeof(stage)), fd;

	atomic_store(&sl->through, 1);
	if (!rc && asprintf(&tmp, "%s/file", stage) < 0)
		tmp = NULL, rc = -ENOMEM;
	if (!rc)
		rc = sl__fs_download(q->src, -1, AT_FDCWD, tmp, tmp, NULL, NULL, &sl->w);
	if (!rc && (fd = sl__open_file(tmp, O_RDONLY, 0)) < 0)
		rc = fd;
	else if (!rc) {
		if (fstat(fd, &st) == 0)
			atomic_store(&sl->fetched, (uint64_t)st.st_size);
		if (!(rc = sl__fs_upload_fd(fd, tmp, q->dst, &sl->w)) && fstat(fd, &st) == 0)
			*bytes = (uint64_t)st.st_size;
		close(fd);
	}
	if (tmp)
		unlink(tmp);
	if (stage[0])
		rmdir(stage);
	free(tmp);
	atomic_store(&sl->through, 0);
	atomic_store(&sl->fetched, 0);
	return rc;
}

/*
 * A local source's file, opened: a tree's beneath the tree's directory by
 * its real path with no link followed (one swapped in since the listing
 * is refused), and checked to be the file listed; a file named alone as
 * the user named it.
 */
static int sl_open_source(const struct sl_copy *c, const struct sl_pair *q)
{
	struct stat st;
	int fd;

	if (!q->real)
		return sl__open_file(q->src, O_RDONLY, 0);
	fd = q->real[0] == '/' ? sl__open_beneath(c->slashfd, q->real + 1, q->src)
			       : sl__open_beneath(c->rootfd, q->real, q->src);
	if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_dev != q->dev || st.st_ino != q->ino)) {
		close(fd);
		fd = sl__err(-ESTALE, "%s: not the file that was listed (another was put there since, or a link to one): "
			     "not copied", q->src);
	}
	return fd;
}

/* One file into a local destination: fetched (or copied from src_fd) beside it, then renamed there; or a link made. */
static int sl_copy_in(struct sl_copy *c, const struct sl_pair *q, int src_fd, struct sl_slot *sl, uint64_t *bytes)
{
	int dirfd = AT_FDCWD, ok = 0, rc;
	const char *file = q->dst;
	char name[48] = "";
	struct stat st;

	if ((rc = sl_parents(q, &dirfd, &file)))
		;
	else if (q->link)
		rc = sl__fs_link(q->link, dirfd, file, q->dst);
	else if ((rc = sl__fs_download(q->src, src_fd, dirfd, file, q->dst, &ok, name, &sl->w)) == 0) {
		if (ok)
			atomic_fetch_add(&c->verified, 1);
		sl_copy_note(c, ok, name);
		if (fstatat(dirfd, file, &st, AT_SYMLINK_NOFOLLOW) == 0)
			*bytes = (uint64_t)st.st_size;
	}
	if (dirfd != AT_FDCWD)
		close(dirfd);
	return rc;
}

static void *sl_copy_run(void *arg)
{
	struct sl_copy *c = arg;
	struct sl_slot *sl = &c->slot[atomic_fetch_add(&c->slots_taken, 1) % SL_FILES_AT_ONCE];

	for (size_t i; (i = atomic_fetch_add(&c->next, 1)) < c->n && !atomic_load(&c->fail.err);) {
		struct sl_pair *q = &c->p[i];
		uint64_t bytes = 0;
		struct stat st;
		int rc = 0, fd = -1;

		if (c->src_local && !q->link && (rc = fd = sl_open_source(c, q)) >= 0)
			rc = 0;
		if (fd >= 0 && fstat(fd, &st) == 0)
			atomic_store(&sl->size, (uint64_t)st.st_size);
		if (rc)
			;
		else if (c->dst_local)
			rc = sl_copy_in(c, q, fd, sl, &bytes);
		else if (!c->src_local)
			rc = sl_copy_through(q, sl, &bytes);
		else if (!(rc = sl__fs_upload_fd(fd, q->src, q->dst, &sl->w)) && fstat(fd, &st) == 0)
			bytes = (uint64_t)st.st_size;
		if (fd >= 0)
			close(fd);
		/* Done: no longer underway, then counted whole (the progress told dips a moment, never counts twice). */
		atomic_store(&sl->w.sent, 0);
		atomic_store(&sl->size, 0);
		atomic_fetch_add(&c->bytes, bytes);
		atomic_fetch_add(&c->files_done, 1);
		if (rc)
			sl__first_err_keep(&c->fail, rc);
	}
	return NULL;
}

/*
 * The bytes copied so far: the files done, and of each underway what it
 * has written (the blocks its copy holds, up to its size: a download's
 * pieces land in any order, in a file sized first) or an upload read.
 */
static uint64_t sl_copy_so_far(struct sl_copy *c)
{
	uint64_t done = atomic_load(&c->bytes);

	for (unsigned i = 0; i < SL_FILES_AT_ONCE; i++) {
		struct sl_slot *sl = &c->slot[i];
		uint64_t size = atomic_load(&sl->size), wrote = 0, sent = atomic_load(&sl->w.sent);
		struct stat st;

		pthread_mutex_lock(&sl->w.lock);
		if (sl->w.fd >= 0 && fstat(sl->w.fd, &st) == 0) {
			wrote = (uint64_t)st.st_blocks * 512;
			wrote = wrote < (uint64_t)st.st_size ? wrote : (uint64_t)st.st_size;
		}
		pthread_mutex_unlock(&sl->w.lock);
		if (atomic_load(&sl->fetched))
			wrote = atomic_load(&sl->fetched);
		wrote = atomic_load(&sl->through) ? (wrote + sent) / 2 : wrote + sent;
		done += size && wrote > size ? size : wrote;
	}
	return done;
}

static void sl_copy_tell(struct sl_copy *c, uint64_t bytes)
{
	if (c->total && bytes > c->total)
		bytes = c->total;
	if (bytes < c->told) /* a file's count moving from underway to done */
		bytes = c->told;
	c->told = bytes;
	c->progress(bytes, c->total, atomic_load(&c->files_done), c->n, c->progress_arg);
}

/* The progress thread: told every SL_TELL_MS until the copy stops it. */
static void *sl_copy_teller(void *arg)
{
	struct sl_copy *c = arg;
	struct timespec ts;

	pthread_mutex_lock(&c->tell_lock);
	while (!c->stop) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += SL_TELL_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		if (pthread_cond_timedwait(&c->tell_cond, &c->tell_lock, &ts) == 0 || c->stop)
			continue;
		pthread_mutex_unlock(&c->tell_lock);
		sl_copy_tell(c, sl_copy_so_far(c));
		pthread_mutex_lock(&c->tell_lock);
	}
	pthread_mutex_unlock(&c->tell_lock);
	return NULL;
}

/* The last segment of p's path into out: a URL's query and fragment left out (a presigned URL's are credentials). */
static const char *sl_base(const struct sl_copy *c, const char *p, char out[1024])
{
	size_t n = c->src_url ? strcspn(p, "?#") : strlen(p), b = n;

	while (b && p[b - 1] != '/')
		b--;
	snprintf(out, 1024, "%.*s", (int)(n - b), p + b);
	return out;
}

/*
 * 1 where a key's name below the source prefix (rel) would not name a file
 * below the destination directory: a ".." segment (outside it), or "."
 * or empty segments and an absolute name (somewhere other than its name
 * says, or two keys onto one file).  S3 allows all of them in keys; the
 * AWS CLI refuses them too.
 */
static int sl_rel_escapes(const char *rel)
{
	for (const char *s = rel;; s++) {
		size_t n = strcspn(s, "/");

		if (!n || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return 1;
		s += n;
		if (!*s)
			return 0;
	}
}

static int sl_refuse_escape(const char *src, const char *dst)
{
	return sl__err(-EINVAL, "%s: its name would put its copy outside %s (a '..', '.' or empty segment, or an "
		       "absolute name); nothing was copied", src, dst);
}

/* One file (or link) of a local tree into c's plan. */
static int sl_tree_add(void *arg, const struct sl__tree_entry *e)
{
	struct sl_copy *c = arg;
	struct sl_pair *q;
	char *name = NULL;
	int rc;

	if (asprintf(&name, "%s%s%s", c->tree, c->tree[strlen(c->tree) - 1] == '/' ? "" : "/", e->rel) < 0)
		return -ENOMEM;
	rc = sl_copy_add(c, name, c->tree_dst, c->tree_sep, e->rel);
	free(name);
	if (rc)
		return rc;
	q = &c->p[c->n - 1];
	q->dev = e->st->st_dev;
	q->ino = e->st->st_ino;
	if (!(q->real = strdup(e->real)) || (e->link && !(q->link = strdup(e->link))))
		return -ENOMEM;
	if (!e->link)
		c->total += (uint64_t)e->st->st_size;
	return 0;
}

/*
 * A local destination's parent, as cp(1) wants it: the directory that
 * receives a file (or a tree's DST, which the copy makes) must exist, so a
 * mistyped DST is an error rather than a new tree made without a word.
 * Below DST, the tree's own directories are made (sl_parents).
 */
static int sl_dst_parent(const char *dst, int tree)
{
	char *d = strdup(dst), *p;
	struct stat st;
	int rc = 0;

	if (!d)
		return -ENOMEM;
	for (p = d + strlen(d); p > d + 1 && p[-1] == '/'; p--)
		;
	if (!tree && p < d + strlen(d)) /* "dir/": the directory named must be there */
		*p = 0;
	else if ((p = strrchr(d, '/')))
		p[p == d] = 0; /* its parent: "/" for "/x", "a" for "a/b" */
	else
		d[0] = '.', d[1] = 0;
	if (stat(d, &st) < 0)
		rc = sl__err(-errno, "%s: %s: %s (%s)", dst, d, strerror(errno),
			     tree ? "a tree's copy makes DST, not the directories above it"
				  : "the directory that receives the copy must exist");
	else if (!S_ISDIR(st.st_mode))
		rc = sl__err(-ENOTDIR, "%s: %s: not a directory", dst, d);
	free(d);
	return rc;
}

static int sl_copy_plan(struct sl_copy *c, const char *src, const char *dst, unsigned flags)
{
	char base[1024];
	struct stat st;
	int rc;

	c->src_local = sl__fs_is_local(src);
	c->dst_local = sl__fs_is_local(dst);
	c->src_url = !!(sl__store_of(src)->caps & SL_STORE_URL_NAMES);
	c->dst_url = !!(sl__store_of(dst)->caps & SL_STORE_URL_NAMES);
	if ((flags & SLUICE_COPY_LINKS) && !c->dst_local)
		return sl__err(-EOPNOTSUPP, "%s: links cannot be kept (--links, SLUICE_COPY_LINKS): the %s store holds "
			       "files alone, no symbolic links; without it, each link inside the tree is copied as the file "
			       "it leads to", dst, sl__store_of(dst)->name);
	if (c->dst_local && (rc = sl_dst_parent(dst, !!(flags & SLUICE_COPY_RECURSIVE))))
		return rc;
	if ((flags & SLUICE_COPY_RECURSIVE) && c->src_local) {
		size_t dl = strlen(dst);
		unsigned tf = (flags & SLUICE_COPY_LINKS ? SL_TREE_LINKS : 0) | (flags & SLUICE_COPY_FOLLOW ? SL_TREE_FOLLOW : 0);
		char real[PATH_MAX];

		c->tree = src;
		c->tree_dst = dst;
		c->tree_sep = dl && dst[dl - 1] == '/' ? "" : "/";
		/* Its files are opened below these, by the real names the walk gives. */
		if (!realpath(src, real) || (c->rootfd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			return sl__err(errno == ENOTDIR ? -ENOTDIR : -errno, "%s: %s", src,
				       errno == ENOTDIR ? "not a directory" : strerror(errno));
		if ((flags & SLUICE_COPY_FOLLOW) && (c->slashfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			return sl__err(-errno, "/: %s", strerror(errno));
		if ((rc = sl__local_tree(src, tf, sl_tree_add, c, &c->skipped)))
			return rc;
		return c->n ? 0 : sl__err(-ENOENT, "%s: no files below it", src);
	}
	if (flags & SLUICE_COPY_RECURSIVE) {
		size_t dl = strlen(dst), sl = strlen(src);
		const char *sep = dl && dst[dl - 1] == '/' ? "" : "/";
		char **names;
		unsigned n;

		if ((rc = sl__fs_stat(src, &st)) == 0 && !S_ISDIR(st.st_mode))
			rc = sl__err(-ENOTDIR, "%s: not a directory", src);
		if (rc || (rc = sl__fs_list(src, 1, &names, &n)))
			return rc;
		if (!n)
			rc = sl__err(-ENOENT, "%s: no files below it", src);
		/*
		 * names are src, a '/' where src has none at its end, then the
		 * name relative to src: a key's or link's rest, checked before
		 * anything is copied.
		 */
		for (unsigned i = 0; i < n; i++) {
			const char *rel = names[i] + sl;

			if (sl && src[sl - 1] != '/' && *rel == '/')
				rel++;
			if (!rc && sl_rel_escapes(rel))
				rc = sl_refuse_escape(names[i], dst);
			if (!rc)
				rc = sl_copy_add(c, names[i], dst, sep, rel);
			free(names[i]);
		}
		free(names);
		return rc;
	}
	/* One file: dst names the copy, or a directory that receives it. */
	if ((rc = sl__fs_stat(src, &st)))
		return rc;
	if (!S_ISREG(st.st_mode))
		return sl__err(-EISDIR, "%s: a directory or prefix, not a file (a tree needs --recursive)", src);
	c->total = (uint64_t)st.st_size;
	if (!c->dst_local)
		return sl_copy_add(c, src, dst, "", dst[strlen(dst) - 1] == '/' ? sl_base(c, src, base) : "");
	if (stat(dst, &st) == 0 && S_ISDIR(st.st_mode))
		return sl_rel_escapes(sl_base(c, src, base)) ? sl_refuse_escape(src, dst)
							     : sl_copy_add(c, src, dst, dst[strlen(dst) - 1] == '/' ? "" : "/", base);
	return sl_copy_add(c, src, dst, "", "");
}

int sluice_copy_with_progress(const char *src, const char *dst, unsigned flags, struct sluice_copy_report *rep,
			      void (*progress)(uint64_t bytes, uint64_t total, uint64_t files_done, uint64_t files,
					       void *arg),
			      void *arg)
{
	struct sl_copy c = { .rootfd = -1, .slashfd = -1, .progress = progress, .progress_arg = arg };
	const unsigned known = SLUICE_COPY_RECURSIVE | SLUICE_COPY_LINKS | SLUICE_COPY_FOLLOW;
	uint64_t t0 = sl__now_ns();
	pthread_condattr_t ca;
	pthread_t teller;
	int rc, telling = 0;

	sl__err_clear();
	if ((rc = SL_REPORT_IN(rep, copy_report)))
		return rc;
	if (!src || !dst || !*src || !*dst)
		return sl__err(-EINVAL, "copy: a source and a destination are needed");
	if (flags & ~known)
		return sl__err(-EINVAL, "copy: unknown flags 0x%x", flags & ~known);
	sl__first_err_init(&c.fail);
	pthread_mutex_init(&c.lock, NULL);
	pthread_mutex_init(&c.tell_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c.tell_cond, &ca);
	pthread_condattr_destroy(&ca);
	for (unsigned i = 0; i < SL_FILES_AT_ONCE; i++) {
		pthread_mutex_init(&c.slot[i].w.lock, NULL);
		c.slot[i].w.fd = -1;
	}
	rc = sl_copy_plan(&c, src, dst, flags);
	if (!rc && sl__test_copy_listed)
		sl__test_copy_listed();
	if (!rc && progress)
		telling = pthread_create(&teller, NULL, sl_copy_teller, &c) == 0;
	if (!rc && c.n)
		sl__fanout(c.n < SL_FILES_AT_ONCE ? (unsigned)c.n : SL_FILES_AT_ONCE, sl_copy_run, &c);
	if (telling) {
		pthread_mutex_lock(&c.tell_lock);
		c.stop = 1;
		pthread_cond_signal(&c.tell_cond);
		pthread_mutex_unlock(&c.tell_lock);
		pthread_join(teller, NULL);
	}
	if (!rc)
		rc = sl__first_err_raise(&c.fail);
	if (!rc && progress) /* the last word: all of it */
		sl_copy_tell(&c, atomic_load(&c.bytes));
	if (rep && !rc) {
		const char *put_sum = sl__store_of(dst)->put_sum;

		rep->files = c.n;
		rep->files_verified = c.dst_local ? atomic_load(&c.verified) : 0;
		if (SL_COVERS(rep, checksum))
			snprintf(rep->checksum, sizeof(rep->checksum), "%s",
				 !c.dst_local ? (put_sum ? put_sum : "none") : c.why_not[0] ? c.why_not : c.what);
		rep->bytes = atomic_load(&c.bytes);
		if (SL_COVERS(rep, skipped))
			rep->skipped = c.skipped;
		rep->seconds = (double)(sl__now_ns() - t0) / 1e9;
	}
	for (size_t i = 0; i < c.n; i++) {
		free(c.p[i].src);
		free(c.p[i].dst);
		free(c.p[i].real);
		free(c.p[i].link);
	}
	free(c.p);
	if (c.rootfd >= 0)
		close(c.rootfd);
	if (c.slashfd >= 0)
		close(c.slashfd);
	for (unsigned i = 0; i < SL_FILES_AT_ONCE; i++)
		pthread_mutex_destroy(&c.slot[i].w.lock);
	pthread_cond_destroy(&c.tell_cond);
	pthread_mutex_destroy(&c.tell_lock);
	pthread_mutex_destroy(&c.lock);
	sl__first_err_fini(&c.fail);
	return rc;
}

int sluice_copy(const char *src, const char *dst, unsigned flags, struct sluice_copy_report *rep)
{
	return sluice_copy_with_progress(src, dst, flags, rep, NULL, NULL);
}
