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

static int sl_http_open(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env)
{
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl_http_file *h = calloc(1, sizeof(*h));
	struct sl__http_resp k = { .keep = "Accept-" };
	struct sl__http_req q;
	int rc;

	(void)flags, (void)env;
	if (!h)
		return -ENOMEM;
	sluice_url_redact(path, h->name, sizeof(h->name));
	if (strlen(path) >= sizeof(h->url))
		rc = sl__err(SLUICE_EINVAL_CONFIG, "%.200s...: a URL over %zu bytes", h->name, sizeof(h->url) - 1);
	else if (!c)
		rc = sl__err(-ENOMEM, "%s: no connection", path);
	else
		rc = sl_http_retries(&h->retries);
	if (rc) {
		free(h);
		return rc;
	}
	snprintf(h->url, sizeof(h->url), "%s", path);
	sl_http_req(h, &q, SL_HTTP_HEAD);
	rc = sl__http_request(c, &q, &k);
	if (!rc && !k.have_size)
		rc = sl__err(-EIO, "%s: the server gives no Content-Length, so the file cannot be read by ranges", h->name);
	if (!rc && !strcasecmp(sl__http_kept(&k, "Ranges"), "none"))
		rc = sl__err(-EIO, "%s: the server does not serve byte ranges (Accept-Ranges: none)", h->name);
	if (rc) {
		free(h);
		return rc;
	}
	if (k.etag[0] == '"')
		snprintf(h->etag, sizeof(h->etag), "%s", k.etag);
	else if (k.last_modified[0])
		snprintf(h->pin, sizeof(h->pin), "If-Unmodified-Since: %s", k.last_modified);
	snprintf(h->seen_etag, sizeof(h->seen_etag), "%s", k.etag);
	snprintf(h->seen_modified, sizeof(h->seen_modified), "%s", k.last_modified);
	h->size = k.size;
	if (!k.etag[0] && !k.last_modified[0])
		sl__debug("http", "%s: no ETag and no Last-Modified: only a change of size can be seen while it is read",
			  h->name);
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

	sl_http_req(h, &q, SL_HTTP_GET);
	q.off = io->offset;
	q.len = io->len;
	q.buf = io->buf;
	q.if_match = h->etag;
	q.hdr[0] = h->pin[0] ? h->pin : NULL;
	q.seen_etag = h->seen_etag;
	q.seen_modified = h->seen_modified;
	q.total = h->size;
	q.total_known = 1;
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

static const char *const sl_http_settings[] = { "SLUICE_HTTP_RETRIES", NULL };

const struct sl__store sl__store_http = {
	.name = "http",
	.id = SL_STORE_ID_http,
	.caps = SL_STORE_STREAM | SL_STORE_SUMS | SL_STORE_READONLY,
	.match = sl_http_match,
	.probe = sl_http_probe,
	.open = sl_http_open,
	.close = sl_http_close,
	.init = sl__sync_init,
	.submit = sl_http_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
	.settings = sl_http_settings,
};
