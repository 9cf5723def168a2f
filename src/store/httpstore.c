/*
 * The http store: http:// and https:// URLs of any web server that serves
 * byte ranges (model files are often published so).  Opening one is a
 * HEAD: its size (Content-Length), and what pins the version read, its
 * ETag (strong ones, sent back as If-Match) or else its Last-Modified
 * (If-Unmodified-Since), so that a file replaced on the server while it
 * is read fails with -ESTALE instead of mixing two versions.  A segment's
 * storage read is one ranged GET on the worker thread's kept-alive
 * connection, checked against its request by the transport (http.c).
 * Read-only.  Redirects are followed; errors name the URL without its
 * query (a presigned URL's query is a credential).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "remote/remote.h"
#include "store/names.h"
#include "store/store.h"

struct sl_http_file {
	char url[4096];
	char name[512];     /* the URL without its query, for messages */
	char etag[128];     /* strong ETag, sent as If-Match; "" if none */
	char pin[128];      /* else "If-Unmodified-Since: <Last-Modified>"; "" if none */
	char seen_etag[128], seen_modified[64];  /* as the HEAD gave them (weak ETags too): answers must match */
	uint64_t size;      /* as the HEAD gave it: every answer's total must be it */
	unsigned retries;
};

static int sl_http_match(const char *path)
{
	return !strncasecmp(path, "http://", 7) || !strncasecmp(path, "https://", 8);
}

static int sl_http_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	(void)cfg;
	if (sl__http_init()) {
		snprintf(why, n, "http unusable: %s", sluice_last_error_detail());
		return SLUICE_EBACKEND;
	}
	return 0;
}

/* SLUICE_HTTP_RETRIES: more attempts after a failed or mismatched answer. */
static int sl_http_retries(unsigned *out)
{
	uint64_t r;
	int rc = sl__setting_u64("SLUICE_HTTP_RETRIES", &r);

	*out = (unsigned)r;
	return rc;
}

static void sl_http_req(const struct sl_http_file *h, struct sl__http_req *q, int method)
{
	memset(q, 0, sizeof(*q));
	q->method = method;
	q->url = h->url;
	q->name = h->name;
	q->retries = h->retries;
	q->follow = 1;
}

/* h names path: its URL, how messages show it (no query, no password), its retries; 0 or an error. */
static int sl_http_named(const char *path, struct sl_http_file *h)
{
	memset(h, 0, sizeof(*h));
	sluice_url_redact(path, h->name, sizeof(h->name));
	if (strlen(path) >= sizeof(h->url))
		return sl__err(SLUICE_EINVAL_CONFIG, "%.200s...: a URL over %zu bytes", h->name, sizeof(h->url) - 1);
	snprintf(h->url, sizeof(h->url), "%s", path);
	return sl_http_retries(&h->retries);
}

/* A HEAD of path into k (h: path named), redirects followed where follow is set. */
static int sl_http_head(const char *path, struct sl_http_file *h, struct sl__http_resp *k, int follow)
{
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl__http_req q;
	int rc = sl_http_named(path, h);

	if (rc)
		return rc;
	if (!c)
		return sl__err(-ENOMEM, "%s: no connection", h->name);
	sl_http_req(h, &q, SL_HTTP_HEAD);
	q.follow = follow;
	return sl__http_request(c, &q, k);
}

/*
 * h pinned to the version a HEAD (k) saw, for ranged GETs: its strong ETag
 * (If-Match), else its Last-Modified (If-Unmodified-Since), and what every
 * answer must match; 0, or -EIO where the file cannot be read by ranges.
 */
static int sl_http_pin(struct sl_http_file *h, const struct sl__http_resp *k)
{
	if (!k->have_size)
		return sl__err(-EIO, "%s: the server gives no Content-Length, so the file cannot be read by ranges", h->name);
	if (!strcasecmp(sl__http_kept(k, "Ranges"), "none"))
		return sl__err(-EIO, "%s: the server does not serve byte ranges (Accept-Ranges: none)", h->name);
	if (k->etag[0] == '"')
		snprintf(h->etag, sizeof(h->etag), "%s", k->etag);
	else if (k->last_modified[0])
		snprintf(h->pin, sizeof(h->pin), "If-Unmodified-Since: %s", k->last_modified);
	snprintf(h->seen_etag, sizeof(h->seen_etag), "%s", k->etag);
	snprintf(h->seen_modified, sizeof(h->seen_modified), "%s", k->last_modified);
	h->size = k->size;
	if (!k->etag[0] && !k->last_modified[0])
		sl__debug("http", "%s: no ETag and no Last-Modified: only a change of size can be seen while it is read",
			  h->name);
	return 0;
}

/* A ranged GET of h's [off, off + len) into buf, pinned to the version h was opened at. */
static void sl_http_range(const struct sl_http_file *h, struct sl__http_req *q, uint64_t off, size_t len, void *buf)
{
	sl_http_req(h, q, SL_HTTP_GET);
	q->off = off;
	q->len = len;
	q->buf = buf;
	q->if_match = h->etag;
	q->hdr[0] = h->pin[0] ? h->pin : NULL;
	q->seen_etag = h->seen_etag;
	q->seen_modified = h->seen_modified;
	q->total = h->size;
	q->total_known = 1;
}

static int sl_http_open(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env)
{
	struct sl_http_file *h = malloc(sizeof(*h));
	struct sl__http_resp k = { .keep = "Accept-" };
	int rc = h ? sl_http_head(path, h, &k, 1) : -ENOMEM;

	(void)flags, (void)env;
	if (!rc && k.at_dir)
		rc = sl__err(-EISDIR, "%s: a directory (the server answers it as one): name a file in it, or the "
			     "directory with a '/' at its end where a directory is taken", h->name);
	if (!rc)
		rc = sl_http_pin(h, &k);
	if (rc) {
		free(h);
		return rc;
	}
	sf->handle = h;
	sf->shown = h->name;
	snprintf(sf->sum_name, sizeof(sf->sum_name), "none (web servers send no checksum)");
	atomic_store(&sf->size, k.size);
	return 0;
}

static void sl_http_close(struct sl__sfile *sf)
{
	free(sf->handle);
	sf->handle = NULL;
}

static void sl_http_progress(void *arg, size_t bytes)
{
	struct sl__io *io = arg;

	io->progress(io, bytes);
}

static int sl_http_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	const struct sl_http_file *h = io->handle;
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl__http_resp k = { .cap = io->len, .progress = io->progress ? sl_http_progress : NULL,
				   .progress_arg = io, .sum_kind = io->sum_kind };
	struct sl__http_req q;
	int rc;

	sl_http_range(h, &q, io->offset, io->len, io->buf);
	if (io->op != SL_IO_READ)
		rc = sl__err(-EROFS, "%s: http files are read-only", h->name);
	else if (!c)
		rc = sl__err(-ENOMEM, "%s: no connection", h->name);
	else if (!io->len)
		rc = 0;
	else
		rc = sl__http_request(c, &q, &k); /* a change is -ESTALE, named by http.c */
	io->res = rc ? rc : (ssize_t)k.got;
	io->sum = k.sum;
	snprintf(io->detail, sizeof(io->detail), "%s", rc ? sluice_last_error_detail() : "");
	return sl__sync_complete(ctx, io);
}

/* ---- Names ---- */

/*
 * A URL's version as its HEAD gave it (store.h's tag): its strong ETag,
 * else its weak ETag (which changes with the content too), Last-Modified
 * and size; "" where it has neither ETag nor Last-Modified.
 */
static void sl_http_tag(const struct sl__http_resp *k, char *tag, size_t cap)
{
	if (k->etag[0] == '"')
		snprintf(tag, cap, "etag %s", k->etag);
	else if (k->etag[0] || k->last_modified[0])
		snprintf(tag, cap, "weak %s modified %s size %llu", k->etag, k->last_modified, (unsigned long long)k->size);
	else
		tag[0] = 0;
}

static int sl_http_info(const char *path, struct sl__entry *e)
{
	struct sl_http_file h;
	struct sl__http_resp k = { 0 };
	int rc = sl_http_head(path, &h, &k, 1);

	memset(e, 0, sizeof(*e));
	if (!rc && k.at_dir) {
		e->kind = SL_KIND_DIR; /* a directory: its URL with a '/', or a redirect there (nginx's, Apache's) */
		return 0;
	}
	if (rc == -EACCES && path[strlen(path) - 1] == '/')
		return sl__err(-EOPNOTSUPP, "%s: the server gives no listing of it (%s)", h.name, sluice_last_error_detail());
	if (!rc && !k.have_size)
		rc = sl__err(-EIO, "%s: the server gives no Content-Length", h.name);
	if (rc)
		return rc;
	e->kind = SL_KIND_FILE;
	e->size = k.size;
	sl_http_tag(&k, e->tag, sizeof(e->tag));
	return 0;
}

/*
 * A listing's walk: its directories read so far, against the most
 * (SLUICE_HTTP_LIST_DIRS): the pages are the server's, and one that makes
 * up two subdirectories on every page, 25 deep, was walked for ever.
 */
struct sl_http_dirs {
	uint64_t read, max;
	const char *top;
};

struct sl_http_walk {
	const char *url;
	int recursive;
	unsigned depth;
	struct sl_http_dirs *dirs;
	int (*add)(void *arg, const char *name);
	void *arg;
};

/* One link of a listing: a file's whole URL to add, a directory's listed in turn (recursive). */
static int sl_http_list_in(const char *dir, int recursive, unsigned depth, struct sl_http_dirs *dirs,
			   int (*add)(void *arg, const char *name), void *arg);

static int sl_http_link(void *arg, const char *href, size_t len, int dir)
{
	const struct sl_http_walk *w = arg;
	char *name = NULL;
	int rc = 0;

	if (dir && !w->recursive)
		return 0;
	if (asprintf(&name, "%s%.*s", w->url, (int)len, href) < 0)
		return -ENOMEM;
	rc = dir ? sl_http_list_in(name, 1, w->depth + 1, w->dirs, w->add, w->arg) : w->add(w->arg, name);
	free(name);
	return rc;
}

/*
 * A web server's listing of dir (an nginx autoindex, Apache's, Python's
 * http.server: an HTML page of links): each link to an entry of it, as
 * dir + the link; links ending in '/' are directories, listed in turn
 * with recursive, at most 32 deep.  A page is at most 16 MiB and 5
 * minutes an attempt.
 */
static int sl_http_list_in(const char *dir, int recursive, unsigned depth, struct sl_http_dirs *dirs,
			   int (*add)(void *arg, const char *name), void *arg)
{
	enum { CAP = 16 << 20 };
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl_http_file h;
	struct sl__http_resp k = { .cap = CAP - 1 };
	struct sl__http_req q;
	char *body = malloc(CAP), *url = NULL;
	int rc = body && c ? 0 : -ENOMEM;

	if (!rc && asprintf(&url, "%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/") < 0)
		url = NULL, rc = -ENOMEM;
	if (!rc && depth > 32)
		rc = sl__err(-ELOOP, "%s: directories more than 32 deep", dir);
	if (!rc && ++dirs->read > dirs->max)
		rc = sl__err(-E2BIG, "%s: its listing holds more than %llu directories (SLUICE_HTTP_LIST_DIRS): a server "
			     "that makes them up, or a tree to list in parts", dirs->top, (unsigned long long)dirs->max);
	if (!rc && !(rc = sl_http_named(url, &h))) {
		sl_http_req(&h, &q, SL_HTTP_GET);
		q.buf = body;
		q.timeout_s = 300; /* a page trickled just above the stall rule's rate ends too */
		rc = sl__http_request(c, &q, &k);
		if (rc == -EACCES || rc == -ENOENT)
			rc = sl__err(-EOPNOTSUPP, "%s: the server gives no listing of it (%s)", h.name,
				     sluice_last_error_detail());
	}
	if (!rc)
		body[k.got] = 0;
	if (!rc) {
		struct sl_http_walk w = { url, recursive, depth, dirs, add, arg };

		rc = sl__web_links(body, k.got, url, sl_http_link, &w);
	}
	free(url);
	free(body);
	return rc;
}

static int sl_http_list(const char *dir, int recursive, int (*add)(void *arg, const char *name), void *arg)
{
	struct sl_http_dirs dirs = { 0, 65536, dir };
	int rc = sl__setting_u64("SLUICE_HTTP_LIST_DIRS", &dirs.max);

	return rc ? rc : sl_http_list_in(dir, recursive, 0, &dirs, add, arg);
}

/* A write the server does not take (no WebDAV there) is -EROFS, saying so; other errors as they are. */
static int sl_http_refused(int rc, const struct sl__http_resp *k, const char *name, const char *method)
{
	if (k->status != 405 && k->status != 501 && k->status != 403)
		return rc;
	return sl__err(-EROFS, "%s: the server takes no %s (HTTP %ld): http files are read-only there; a web server "
		       "with WebDAV's PUT and DELETE (nginx's dav_methods) takes writes", name, method, k->status);
}

/* A WebDAV request that changes path (DELETE, or PUT of len bytes of body); a server without WebDAV: -EROFS. */
static int sl_http_change(const char *path, int method, const void *body, size_t len)
{
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl_http_file h;
	struct sl__http_resp k = { 0 };
	struct sl__http_req q;
	int rc = c ? sl_http_named(path, &h) : -ENOMEM;

	if (rc)
		return rc;
	sl_http_req(&h, &q, method);
	q.buf = (void *)body;
	q.len = len;
	rc = sl__http_request(c, &q, &k);
	return rc ? sl_http_refused(rc, &k, h.name, method == SL_HTTP_PUT ? "PUT" : "DELETE") : 0;
}

/* DELETE (WebDAV's, nginx's dav_methods). */
static int sl_http_remove(const char *path)
{
	return sl_http_change(path, SL_HTTP_DELETE, NULL, 0);
}

/* PUT (WebDAV's): the whole file in one request; GPU memory through a host copy. */
static int sl_http_put(const char *path, const void *src, size_t len,
		       int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx,
		       const struct sl__open_env *env)
{
	void *host = copy ? malloc(len ? len : 1) : NULL;
	int rc = copy && !host ? -ENOMEM : 0;

	(void)env;
	if (!rc && copy)
		rc = copy(copy_ctx, host, src, len);
	if (!rc)
		rc = sl_http_change(path, SL_HTTP_PUT, copy ? host : src, len);
	free(host);
	return rc;
}

/* The file as of tag: ranged GETs of 8 MiB, each pinned to the version the HEAD gave (as an open file's reads). */
static int sl_http_fetch(const char *path, const char *tag, int fd, const _Atomic int *cancel, int *verified,
			 char sum_name[48])
{
	enum { CHUNK = 8 << 20 };
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl_http_file h;
	struct sl__http_resp k = { .keep = "Accept-" };
	char now[SL_TAG_MAX];
	char *buf = malloc(CHUNK);
	int rc = buf ? sl_http_head(path, &h, &k, 1) : -ENOMEM;

	if (verified)
		*verified = 0;
	if (sum_name)
		snprintf(sum_name, 48, "none (web servers send no checksum)");
	if (!rc)
		rc = sl_http_pin(&h, &k);
	sl_http_tag(&k, now, sizeof(now));
	if (!rc && tag && strcmp(tag, now))
		rc = sl__err(-ESTALE, "%s: changed on the server since it was listed", h.name);
	for (uint64_t off = 0; !rc && off < h.size; off += CHUNK) {
		struct sl__http_resp g = { .cap = h.size - off < CHUNK ? (size_t)(h.size - off) : CHUNK };
		struct sl__http_req q;
		ssize_t w = 0;

		sl_http_range(&h, &q, off, g.cap, buf);
		if (cancel && atomic_load(cancel))
			rc = sl__err(-ECANCELED, "%s: cancelled", h.name);
		else if (!(rc = sl__http_request(c, &q, &g)) &&
			 (w = sl__pio_full(SL_IO_WRITE, fd, buf, g.got, off)) != (ssize_t)g.got)
			rc = sl__err(w < 0 ? (int)w : -EIO, "%s: writing its copy: %s", h.name, strerror(w < 0 ? (int)-w : EIO));
	}
	free(buf);
	return rc;
}

static const char *const sl_http_settings[] = { "SLUICE_HTTP_RETRIES", NULL };

const struct sl__store sl__store_http = {
	.name = "http",
	.id = SL_STORE_ID_http,
	.caps = SL_STORE_STREAM | SL_STORE_SUMS | SL_STORE_READONLY | SL_STORE_URL_NAMES,
	.match = sl_http_match,
	.probe = sl_http_probe,
	.open = sl_http_open,
	.close = sl_http_close,
	.init = sl__sync_init,
	.submit = sl_http_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
	.settings = sl_http_settings,
	.put = sl_http_put,
	.info = sl_http_info,
	.list = sl_http_list,
	.remove = sl_http_remove,
	.fetch = sl_http_fetch,
};
