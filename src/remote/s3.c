/*
 * S3 requests over libcurl: one object's size and ETag (HEAD), a byte range
 * of it into memory (GET with Range, optionally pinned to an ETag with
 * If-Match), a whole object or a bucket created (PUT).  Requests are signed
 * with Signature V4 by curl (CURLOPT_AWS_SIGV4) with the payload unsigned,
 * as S3 allows; the secret goes to curl and nowhere else.  Each call runs
 * on an easy handle the caller keeps (struct sl__http_conn), so its
 * connection is kept alive from one request to the next.
 *
 * Errors carry the object's URL, the HTTP status and the server's own code
 * (NoSuchKey, AccessDenied, SignatureDoesNotMatch, ...), mapped to errno:
 * 404 -ENOENT, 403 -EACCES, 412 -ESTALE (the object changed), 416 -ERANGE,
 * transport failures -EIO, -ETIMEDOUT, -ECONNREFUSED or -ECONNRESET.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "remote/remote.h"

struct sl__s3 {
	struct sl__s3_conf conf;
	char sigv4[96];              /* "aws:amz:REGION:s3" */
	char userpwd[400];           /* "ACCESS:SECRET" for curl; cleared at close */
	char token_header[4200];     /* "x-amz-security-token: ..." or "" */
	unsigned retries;            /* more attempts after a retryable failure (SLUICE_S3_RETRIES) */
	size_t part_size;            /* bytes of an upload's part (SLUICE_S3_PART_SIZE) */
	unsigned concurrency;        /* an upload's parts in flight (SLUICE_S3_CONCURRENCY) */
};

int sl__s3_open(struct sl__s3 **out, const struct sl__s3_args *args, sl__env_fn env, void *ctx)
{
	struct sl__s3 *s;
	int rc;

	*out = NULL;
	if ((rc = sl__http_init()))
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	rc = sl__s3_conf_resolve(&s->conf, args, env, ctx);
	if (rc) {
		free(s);
		return rc;
	}
	snprintf(s->sigv4, sizeof(s->sigv4), "aws:amz:%s:s3", s->conf.region);
	if (!s->conf.anonymous)
		snprintf(s->userpwd, sizeof(s->userpwd), "%s:%s", s->conf.access_key, s->conf.secret_key);
	if (s->conf.session_token[0])
		snprintf(s->token_header, sizeof(s->token_header), "x-amz-security-token: %s", s->conf.session_token);
	{
		/* Through the registry (its ranges: S3's parts are 5 MiB to 5 GiB); env: a test's table. */
		static const char *const name[3] = { "SLUICE_S3_RETRIES", "SLUICE_S3_PART_SIZE", "SLUICE_S3_CONCURRENCY" };
		uint64_t u[3];

		for (int i = 0; i < 3 && !rc; i++)
			rc = sl__setting_num(name[i], env ? env(name[i], ctx) : sl__setting(name[i]),
					     env ? "the table" : sl__setting_from(name[i]), &u[i]);
		if (rc) {
			sl__s3_close(s);
			return rc;
		}
		s->retries = (unsigned)u[0];
		s->part_size = (size_t)u[1];
		s->concurrency = (unsigned)u[2];
	}
	*out = s;
	return 0;
}

void sl__s3_close(struct sl__s3 *s)
{
	if (!s)
		return;
	/* Secrets do not outlive the client in freed memory. */
	memset(s, 0, sizeof(*s));
	free(s);
}

const struct sl__s3_conf *sl__s3_conf(const struct sl__s3 *s)
{
	return &s->conf;
}

/*
 * Appends s to out (cap bytes at out, l used), percent-encoding all but
 * unreserved characters and, where slash is set (keys), '/'.  Returns the
 * new length, 0 if it does not fit.
 */
static size_t sl_url_encode(char *out, size_t cap, size_t l, const char *s, int slash)
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

/* Appends "?name=value" (or "&name=value" after the first) with value encoded; the new length, 0 if it does not fit. */
static size_t sl_query_param(char *out, size_t cap, size_t l, const char *name, const char *value)
{
	size_t n;

	if (l == 0 && cap && out[0] != '?')
		out[0] = 0;
	n = (size_t)snprintf(out + l, cap - l, "%s%s=", l ? "&" : "?", name);
	return n >= cap - l ? 0 : sl_url_encode(out, cap, l + n, value, 0);
}

/* The request URL of bucket/key, path-style or virtual-host; 0 or an error if it does not fit. */
static int sl_url(const struct sl__s3 *s, const char *bucket, const char *key, char *out, size_t cap)
{
	const char *ep = s->conf.endpoint, *host = strstr(ep, "://") + 3;
	size_t l;

	if (s->conf.path_style)
		l = (size_t)snprintf(out, cap, "%s/%s/", ep, bucket);
	else
		l = (size_t)snprintf(out, cap, "%.*s%s.%s/", (int)(host - ep), ep, bucket, host);
	if (l >= cap || (*key && !sl_url_encode(out, cap, l, key, 1)))
		return sl__err(SLUICE_EINVAL_CONFIG, "s3://%s/%s: the request URL is too long", bucket, key);
	return 0;
}

static const char sl_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The 4 bytes a checksum header carries, base64 ("AAAAAA=="), big-endian; 0 or -1. */
static int sl_b64_u32(const char *s, uint32_t *out)
{
	const char *a = sl_b64;
	uint64_t v = 0;

	if (strlen(s) != 8 || strcmp(s + 6, "=="))
		return -1;
	for (int i = 0; i < 6; i++) {
		const char *c = strchr(a, s[i]);

		if (!c || !*c)
			return -1;
		v = v << 6 | (uint64_t)(c - a);
	}
	if (v & 0xf)
		return -1; /* the padding bits of a canonical encoding are zero */
	*out = (uint32_t)(v >> 4);
	return 0;
}

static void sl_u32_b64(uint32_t x, char out[9])
{
	const char *a = sl_b64;
	uint64_t v = (uint64_t)x << 4;

	for (int i = 5; i >= 0; i--, v >>= 6)
		out[i] = a[v & 63];
	memcpy(out + 6, "==", 3);
}

int sl__s3_error_parse(const char *body, size_t len, char *code, size_t code_cap, char *msg, size_t msg_cap)
{
	static const char *const tag[2][2] = { { "<Code>", "</Code>" }, { "<Message>", "</Message>" } };
	char *out[2] = { code, msg };
	size_t cap[2] = { code_cap, msg_cap };
	int found = 0;

	for (int t = 0; t < 2; t++) {
		const char *a = memmem(body, len, tag[t][0], strlen(tag[t][0])), *b;

		if (cap[t])
			out[t][0] = 0;
		if (!a)
			continue;
		a += strlen(tag[t][0]);
		b = memmem(a, len - (size_t)(a - body), tag[t][1], strlen(tag[t][1]));
		if (!b || !cap[t])
			continue;
		/* Printable ASCII only: the text lands in an error detail. */
		size_t k = 0;

		for (; a < b && k + 1 < cap[t]; a++)
			out[t][k++] = (*a >= 0x20 && *a < 0x7f) ? *a : '?';
		out[t][k] = 0;
		found |= 1 << t;
	}
	return found;
}

enum { SL_HEAD = SL_HTTP_HEAD, SL_GET = SL_HTTP_GET, SL_PUT = SL_HTTP_PUT, SL_POST = SL_HTTP_POST,
       SL_DELETE = SL_HTTP_DELETE };

/*
 * One request.  GET: [off, off + len) into buf, pinned to if_match when
 * set.  PUT and POST: len bytes of buf as the body (a PUT with key ""
 * creates the bucket); the answer's body (POST, DELETE) lands in the
 * answer's small buffer.  query: "" or "?NAME[=VALUE]&..." after the key.
 */
struct sl_req {
	int method;
	const char *bucket, *key, *query;
	uint64_t off;
	size_t len;
	void *buf;
	const char *if_match;
	const char *hdr[4];         /* more request headers ("Name: value"), up to the first NULL */
	unsigned min_retries;       /* at least this many more attempts, whatever SLUICE_S3_RETRIES says */
};

/* " Code: Message" of an S3 error body. */
static void sl_describe(const char *body, size_t len, char *out, size_t cap)
{
	char code[64], msg[256];

	sl__s3_error_parse(body, len, code, sizeof(code), msg, sizeof(msg));
	snprintf(out, cap, "%s%s%s%s", code[0] ? " " : "", code, msg[0] ? ": " : "", msg);
}

/* CompleteMultipartUpload may fail after its 200 has gone out: the error is then in the body. */
static long sl_status_of(const struct sl__http_req *q, const struct sl__http_resp *k)
{
	return k->status == 200 && q->method == SL_POST && strstr(k->err, "<Error>") ? 500 : k->status;
}

/*
 * An S3 request on the transport (http.c): its URL, its signature
 * (unless anonymous), the object's name in errors, and up to
 * SLUICE_S3_RETRIES more attempts (remote.h says how they are made).
 */
static int sl_request(struct sl__s3 *s, struct sl__http_conn *c, const struct sl_req *q, struct sl__http_resp *k)
{
	char url[8192], name[1200];
	struct sl__http_req h = { .method = q->method, .url = url, .name = name, .off = q->off, .len = q->len,
				  .buf = q->buf, .if_match = q->if_match, .describe = sl_describe,
				  .status_of = sl_status_of,
				  .retries = q->min_retries > s->retries ? q->min_retries : s->retries };
	int rc, n = 0;

	if ((rc = sl_url(s, q->bucket, q->key, url, sizeof(url) - 4096)))
		return rc;
	if (q->query && *q->query)
		snprintf(url + strlen(url), sizeof(url) - strlen(url), "%s", q->query);
	snprintf(name, sizeof(name), "s3://%s/%s", q->bucket, q->key);
	if (!s->conf.anonymous) {
		h.sigv4 = s->sigv4;
		h.userpwd = s->userpwd;
		/* The payload is not hashed into the signature (curl cannot hash a body it streams). */
		h.hdr[n++] = "x-amz-content-sha256: UNSIGNED-PAYLOAD";
		if (s->token_header[0])
			h.hdr[n++] = s->token_header;
	}
	if (q->method == SL_HEAD)
		h.hdr[n++] = "x-amz-checksum-mode: ENABLED";
	for (int i = 0; i < 4 && q->hdr[i] && n < SL_HTTP_HDRS; i++)
		h.hdr[n++] = q->hdr[i];
	k->keep = "x-amz-checksum-";
	return sl__http_request(c, &h, k);
}

/*
 * The checksum an answer's headers give (remote.h's struct sl__s3_meta):
 * a full-object CRC32C or CRC32 is one a reader can check.  A composite
 * one says so by its type, or by "-N" (its part count) after the value.
 */
static int sl_meta_sum(const struct sl__http_resp *k, struct sl__s3_meta *m, const char *bucket, const char *key)
{
	const char *c32c = sl__http_kept(k, "crc32c"), *c32 = sl__http_kept(k, "crc32"), *type = sl__http_kept(k, "type");
	const char *v = c32c[0] ? c32c : c32, *name = c32c[0] ? "crc32c" : "crc32", *other = "";

	for (unsigned i = 0; i < k->nkept && !other[0]; i++)
		if (strcasecmp(k->kept[i].name, "crc32c") && strcasecmp(k->kept[i].name, "crc32") &&
		    strcasecmp(k->kept[i].name, "type"))
			other = k->kept[i].name;

	m->sum_kind = SL_CRC_NONE;
	m->sum_name[0] = 0;
	if (!v[0]) {
		if (other[0])
			snprintf(m->sum_name, sizeof(m->sum_name), "%.24s (not verified)", other);
		return 0;
	}
	if (!strcasecmp(type, "COMPOSITE") || strchr(v, '-')) {
		snprintf(m->sum_name, sizeof(m->sum_name), "%s composite (not verified)", name);
		return 0;
	}
	if (sl_b64_u32(v, &m->sum))
		return sl__err(-EIO, "s3://%s/%s: an unreadable x-amz-checksum-%s '%.40s'", bucket, key, name, v);
	m->sum_kind = c32c[0] ? SL_CRC32C : SL_CRC32;
	snprintf(m->sum_name, sizeof(m->sum_name), "%s", name);
	return 0;
}

int sl__s3_head(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, struct sl__s3_meta *m)
{
	struct sl_req q = { .method = SL_HEAD, .bucket = bucket, .key = key };
	struct sl__http_resp k = { 0 };
	int rc = sl_request(s, c, &q, &k);

	if (rc)
		return rc;
	if (!k.have_size)
		return sl__err(-EIO, "s3://%s/%s: HEAD answered without a Content-Length", bucket, key);
	m->size = k.size;
	snprintf(m->etag, sizeof(m->etag), "%s", k.etag);
	return sl_meta_sum(&k, m, bucket, key);
}

ssize_t sl__s3_get(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, uint64_t off,
		   size_t len, void *dst, const char *if_match)
{
	return sl__s3_get_progress(s, c, bucket, key, off, len, dst, if_match, NULL, NULL, 0, NULL);
}

ssize_t sl__s3_get_progress(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
			    uint64_t off, size_t len, void *dst, const char *if_match,
			    void (*progress)(void *arg, size_t bytes), void *arg, int sum_kind, uint32_t *sum)
{
	struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = key, .off = off, .len = len, .buf = dst,
			    .if_match = if_match };
	struct sl__http_resp k = { .cap = len, .progress = progress, .progress_arg = arg, .sum_kind = sum_kind };
	int rc;

	if (!len)
		return 0;
	rc = sl_request(s, c, &q, &k);
	if (!rc && sum)
		*sum = k.sum;
	return rc ? rc : (ssize_t)k.got;
}

int sl__s3_list(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *prefix, const char *delim,
		unsigned max, struct sl__s3_list *l)
{
	char maxs[16];

	enum { CAP = 4 << 20 }; /* a page of 1000 keys of up to 1024 bytes each, escaped, fits */
	char *body = malloc(CAP), query[4096], token[1024] = "";
	int rc = body ? 0 : -ENOMEM;

	do {
		struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = "", .query = query, .buf = body };
		struct sl__http_resp k = { .cap = CAP };
		/* Parameters sorted by name, as a signature's canonical query has them. */
		size_t n = 0;

		if (token[0])
			n = sl_query_param(query, sizeof(query), n, "continuation-token", token);
		if (delim && *delim)
			n = sl_query_param(query, sizeof(query), n, "delimiter", delim);
		n = sl_query_param(query, sizeof(query), n, "list-type", "2");
		if (max) {
			snprintf(maxs, sizeof(maxs), "%u", max);
			n = sl_query_param(query, sizeof(query), n, "max-keys", maxs);
		}
		if (!sl_query_param(query, sizeof(query), n, "prefix", prefix)) {
			rc = sl__err(SLUICE_EINVAL_CONFIG, "s3://%s/%s: the listing's query is too long", bucket, prefix);
			break;
		}
		if (!rc)
			rc = sl_request(s, c, &q, &k);
		if (!rc && (rc = sl__s3_list_parse(body, k.got, l, token, sizeof(token))))
			rc = sl__err(rc, "s3://%s/%s: %s", bucket, prefix, sluice_last_error_detail());
	} while (!rc && token[0] && !max);
	free(body);
	return rc;
}

/* "x-amz-checksum-crc32c: BASE64" of crc into out. */
static const char *sl_crc_header(char out[48], uint32_t crc)
{
	char b64[9];

	sl_u32_b64(crc, b64);
	snprintf(out, 48, "x-amz-checksum-crc32c: %s", b64);
	return out;
}

int sl__s3_put(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, const void *src,
	       size_t len)
{
	struct sl_req q = { .method = SL_PUT, .bucket = bucket, .key = key, .len = len, .buf = (void *)src };
	struct sl__http_resp k = { 0 };
	char sum[48];

	/* The server checks the bytes it received against the sum and keeps it for readers. */
	if (key[0]) {
		q.hdr[0] = sl_crc_header(sum, sluice_crc32c(0, src, len));
		q.hdr[1] = "x-amz-sdk-checksum-algorithm: CRC32C";
	}
	return sl_request(s, c, &q, &k);
}

int sl__s3_delete(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key)
{
	struct sl_req q = { .method = SL_DELETE, .bucket = bucket, .key = key };
	struct sl__http_resp k = { 0 };

	return sl_request(s, c, &q, &k);
}

int sl__s3_obj_open(struct sl__s3_obj **out, struct sl__s3 *s3, const char *url, uint64_t *size)
{
	struct sl__s3_obj *o = calloc(1, sizeof(*o));
	struct sl__http_conn *c = sl__http_thread_conn();
	int rc;

	*out = NULL;
	if (!o)
		return -ENOMEM;
	o->s3 = s3;
	rc = sl__s3_parse_url(url, o->bucket, sizeof(o->bucket), o->key, sizeof(o->key));
	if (!rc && !o->key[0])
		rc = sl__err(-EISDIR, "%s: names a bucket or prefix, not an object", url);
	if (!rc && !c)
		rc = sl__err(-ENOMEM, "%s: no connection", url);
	if (!rc)
		rc = sl__s3_head(s3, c, o->bucket, o->key, &o->meta);
	if (!rc)
		*size = o->meta.size;
	if (rc) {
		free(o);
		return rc;
	}
	*out = o;
	return 0;
}

void sl__s3_obj_close(struct sl__s3_obj *o)
{
	free(o);
}

/* ---- Uploads: one PUT, or a multipart upload whose parts go in parallel ---- */

struct sl_upload {
	struct sl__s3 *s;
	const char *bucket, *key;
	const char *src;
	size_t len;
	int (*copy)(void *ctx, void *dst, const void *src, size_t n);
	void *copy_ctx;
	char query_id[512];         /* "uploadId=..." encoded */
	unsigned nparts;
	_Atomic unsigned next;
	char (*etag)[128];          /* each part's ETag, by part */
	uint32_t *crc;              /* each part's CRC32C, by part */
	struct sl__first_err fail;
};

void sl__first_err_keep(struct sl__first_err *fe, int rc)
{
	pthread_mutex_lock(&fe->lock);
	if (!atomic_load(&fe->err)) {
		snprintf(fe->detail, sizeof(fe->detail), "%s", sluice_last_error_detail());
		atomic_store(&fe->err, rc);
	}
	pthread_mutex_unlock(&fe->lock);
}

/* Part by part, on this thread's connection: the source copied (GPU memory: by u->copy) into a buffer, then sent. */
static void *sl_upload_parts(void *arg)
{
	struct sl_upload *u = arg;
	struct sl__http_conn *c = NULL;
	char *buf = malloc(u->s->part_size);
	int rc = buf ? sl__http_conn_open(&c) : -ENOMEM;

	if (rc)
		sl__first_err_keep(&u->fail, rc);
	for (unsigned i; !rc && (i = atomic_fetch_add(&u->next, 1)) < u->nparts;) {
		size_t off = (size_t)i * u->s->part_size, n = u->len - off < u->s->part_size ? u->len - off : u->s->part_size;
		char query[600], sum[48];
		struct sl_req q = { .method = SL_PUT, .bucket = u->bucket, .key = u->key, .query = query, .len = n,
				    .buf = buf };
		struct sl__http_resp k = { 0 };

		if (atomic_load(&u->fail.err))
			break; /* another part failed: the upload is aborted, sending more is waste */
		snprintf(query, sizeof(query), "?partNumber=%u&%s", i + 1, u->query_id);
		rc = u->copy ? u->copy(u->copy_ctx, buf, u->src + off, n) : (memcpy(buf, u->src + off, n), 0);
		if (!rc) {
			u->crc[i] = sluice_crc32c(0, buf, n);
			q.hdr[0] = sl_crc_header(sum, u->crc[i]);
			rc = sl_request(u->s, c, &q, &k);
		}
		if (!rc && !k.etag[0])
			rc = sl__err(-EIO, "s3://%s/%s: part %u answered without an ETag", u->bucket, u->key, i + 1);
		if (rc)
			sl__first_err_keep(&u->fail, rc);
		else
			memcpy(u->etag[i], k.etag, sizeof(k.etag));
	}
	sl__http_conn_close(c);
	free(buf);
	return NULL;
}

/* The text between <tag> and </tag> in body, into out; 0 or -1 if absent or too long. */
static int sl_xml_text(const char *body, const char *tag, char *out, size_t cap)
{
	char open[64], close[64];
	const char *a, *b;

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	a = strstr(body, open);
	b = a ? strstr(a, close) : NULL;
	if (!b || (size_t)(b - a - strlen(open)) >= cap)
		return -1;
	a += strlen(open);
	memcpy(out, a, (size_t)(b - a));
	out[b - a] = 0;
	return 0;
}

int sl__s3_upload(struct sl__s3 *s, const char *bucket, const char *key, const void *src, size_t len,
		  int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx)
{
	struct sl_upload u = { .s = s, .bucket = bucket, .key = key, .src = src, .len = len, .copy = copy,
			       .copy_ctx = copy_ctx };
	struct sl__http_conn *c = sl__http_thread_conn();
	struct sl__http_resp k = { 0 };
	pthread_t th[256];
	unsigned nth = 0;
	char id[400], *xml = NULL;
	int rc;

	if (!c)
		return sl__err(-ENOMEM, "s3://%s/%s: no connection", bucket, key);
	if (len <= s->part_size) {
		/* One request: the object appears whole when it succeeds, or not at all. */
		char *buf = copy ? malloc(len ? len : 1) : (char *)src;

		rc = buf ? 0 : -ENOMEM;
		if (!rc && copy && len)
			rc = copy(copy_ctx, buf, src, len);
		if (!rc)
			rc = sl__s3_put(s, c, bucket, key, buf, len);
		if (copy)
			free(buf);
		return rc;
	}
	u.nparts = (unsigned)((len + s->part_size - 1) / s->part_size);
	if (len / s->part_size >= 10000)
		return sl__err(SLUICE_EINVAL_CONFIG, "s3://%s/%s: %zu bytes take over 10000 parts of %zu: raise SLUICE_S3_PART_SIZE",
			       bucket, key, len, s->part_size);
	{
		/* The object's checksum will be the CRC32C of all its bytes, not one of the parts' sums. */
		struct sl_req q = { .method = SL_POST, .bucket = bucket, .key = key, .query = "?uploads=",
				    .hdr = { "x-amz-checksum-algorithm: CRC32C", "x-amz-checksum-type: FULL_OBJECT" } };

		rc = sl_request(s, c, &q, &k);
	}
	if (!rc && sl_xml_text(k.err, "UploadId", id, sizeof(id)))
		rc = sl__err(-EIO, "s3://%s/%s: CreateMultipartUpload answered without an UploadId", bucket, key);
	if (rc)
		return rc;
	memcpy(u.query_id, "uploadId=", 9);
	if (!sl_url_encode(u.query_id, sizeof(u.query_id), 9, id, 0)) {
		rc = sl__err(-EIO, "s3://%s/%s: an UploadId of %zu characters", bucket, key, strlen(id));
		goto abort;
	}
	u.etag = calloc(u.nparts, sizeof(*u.etag));
	u.crc = calloc(u.nparts, sizeof(*u.crc));
	if (!u.etag || !u.crc) {
		rc = -ENOMEM;
		goto abort;
	}
	pthread_mutex_init(&u.fail.lock, NULL);
	for (; nth < s->concurrency && nth < u.nparts; nth++)
		if (pthread_create(&th[nth], NULL, sl_upload_parts, &u)) {
			sl__first_err_keep(&u.fail, sl__err(-EAGAIN, "s3://%s/%s: no thread for the upload", bucket, key));
			break;
		}
	for (unsigned i = 0; i < nth; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&u.fail.lock);
	if (u.fail.err) {
		rc = sl__err(u.fail.err, "%s; the upload was aborted, s3://%s/%s is as it was", u.fail.detail, bucket, key);
		goto abort;
	}
	/* Complete: every part, in order, with its ETag (quotes escaped for XML). */
	{
		size_t cap = 64 + (size_t)u.nparts * 260, l;
		struct sl_req q = { .method = SL_POST, .bucket = bucket, .key = key };
		char query[600], sum[48], b64[9];
		uint32_t whole = u.crc[0];

		for (unsigned i = 1; i < u.nparts; i++)
			whole = sl__crc32c_combine(whole, u.crc[i], i + 1 < u.nparts ? s->part_size
										 : len - (size_t)i * s->part_size);
		q.hdr[0] = sl_crc_header(sum, whole);
		q.hdr[1] = "x-amz-checksum-type: FULL_OBJECT";

		xml = malloc(cap);
		if (!xml) {
			rc = -ENOMEM;
			goto abort;
		}
		l = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
		for (unsigned i = 0; i < u.nparts; i++) {
			sl_u32_b64(u.crc[i], b64);
			l += (size_t)snprintf(xml + l, cap - l,
					      "<Part><PartNumber>%u</PartNumber><ChecksumCRC32C>%s</ChecksumCRC32C><ETag>",
					      i + 1, b64);
			for (const char *e = u.etag[i]; *e; e++)
				l += (size_t)snprintf(xml + l, cap - l, "%s", *e == '"' ? "&quot;" : (char[2]){ *e, 0 });
			l += (size_t)snprintf(xml + l, cap - l, "</ETag></Part>");
		}
		l += (size_t)snprintf(xml + l, cap - l, "</CompleteMultipartUpload>");
		snprintf(query, sizeof(query), "?%s", u.query_id);
		q.query = query;
		q.buf = xml;
		q.len = l;
		memset(&k, 0, sizeof(k));
		rc = sl_request(s, c, &q, &k);
		if (!rc)
			goto out;
	}
abort:
	/* Nothing half-made stays behind: the parts sent are dropped with the upload. */
	{
		char query[600], why[512];
		/* The abort is what keeps the store clean: it gets at least 4 more tries, whatever the setting. */
		struct sl_req q = { .method = SL_DELETE, .bucket = bucket, .key = key, .query = query, .min_retries = 4 };

		snprintf(why, sizeof(why), "%s", sluice_last_error_detail());
		snprintf(query, sizeof(query), "?%s", u.query_id);
		memset(&k, 0, sizeof(k));
		if (sl_request(s, c, &q, &k))
			sl__warn("s3", "s3://%s/%s: aborting the multipart upload failed: %s", bucket, key,
				 sluice_last_error_detail());
		sl__err(rc, "%s", why);
	}
out:
	free(xml);
	free(u.etag);
	free(u.crc);
	return rc;
}

/* ---- Downloads: an object into a file by parallel ranged GETs ---- */

struct sl_download {
	struct sl__s3 *s;
	const char *bucket, *key, *etag;
	uint64_t size;
	int fd;
	int sum_kind;               /* the object's checksum's kind, SL_CRC_NONE: none to check */
	uint32_t *crc;              /* each chunk's CRC of that kind, by chunk */
	const _Atomic int *cancel;
	_Atomic uint64_t next;      /* chunk */
	struct sl__first_err fail;
};

static void *sl_download_chunks(void *arg)
{
	struct sl_download *d = arg;
	const size_t chunk = d->s->part_size;
	const uint64_t nchunks = (d->size + chunk - 1) / chunk;
	struct sl__http_conn *c = NULL;
	char *buf = malloc(chunk);
	int rc = buf ? sl__http_conn_open(&c) : -ENOMEM;

	for (uint64_t i; !rc && (i = atomic_fetch_add(&d->next, 1)) < nchunks && !atomic_load(&d->fail.err);) {
		uint64_t off = i * chunk;
		size_t n = d->size - off < chunk ? (size_t)(d->size - off) : chunk;
		ssize_t got;

		if (d->cancel && atomic_load(d->cancel)) {
			rc = sl__err(-ECANCELED, "s3://%s/%s: download cancelled", d->bucket, d->key);
			break;
		}
		got = sl__s3_get_progress(d->s, c, d->bucket, d->key, off, n, buf, d->etag, NULL, NULL, d->sum_kind,
					  d->sum_kind ? &d->crc[i] : NULL);
		if (got >= 0 && (size_t)got != n)
			got = sl__err(-EIO, "s3://%s/%s: %zd bytes at offset %llu, %zu expected (the object is shorter)",
				      d->bucket, d->key, got, (unsigned long long)off, n);
		rc = got < 0 ? (int)got : 0;
		for (size_t w = 0; !rc && w < n;) {
			ssize_t r = pwrite(d->fd, buf + w, n - w, (off_t)(off + w));

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				rc = sl__err(-errno, "s3://%s/%s: writing its copy: %s", d->bucket, d->key, strerror(errno));
			else
				w += (size_t)r;
		}
	}
	if (rc)
		sl__first_err_keep(&d->fail, rc);
	sl__http_conn_close(c);
	free(buf);
	return NULL;
}

/* One pass of a download (sl__s3_download); with d->sum_kind, d->crc holds the chunks' CRCs after. */
static int sl_download_once(struct sl_download *d)
{
	struct sl__s3 *s = d->s;
	const uint64_t nchunks = (d->size + s->part_size - 1) / s->part_size;
	pthread_t th[256];
	unsigned nth = 0;

	atomic_store(&d->next, 0);
	atomic_store(&d->fail.err, 0);
	pthread_mutex_init(&d->fail.lock, NULL);
	for (; nth < s->concurrency && nth < nchunks; nth++)
		if (pthread_create(&th[nth], NULL, sl_download_chunks, d))
			break;
	if (!nth && nchunks)
		sl__first_err_keep(&d->fail, sl__err(-EAGAIN, "s3://%s/%s: no thread for the download", d->bucket, d->key));
	for (unsigned i = 0; i < nth; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&d->fail.lock);
	return d->fail.err ? sl__err(d->fail.err, "%s", d->fail.detail) : 0;
}

int sl__s3_download(struct sl__s3 *s, const char *bucket, const char *key, const struct sl__s3_meta *m, int fd,
		    const _Atomic int *cancel, int *verified)
{
	struct sl_download d = { .s = s, .bucket = bucket, .key = key, .etag = m->etag, .size = m->size, .fd = fd,
				 .sum_kind = m->sum_kind, .cancel = cancel };
	const uint64_t nchunks = (m->size + s->part_size - 1) / s->part_size;
	uint32_t sum = 0;
	int rc = 0;

	if (verified)
		*verified = 0;
	if (ftruncate(fd, (off_t)m->size) < 0)
		return sl__err(-errno, "s3://%s/%s: sizing its copy to %llu bytes: %s", bucket, key,
			       (unsigned long long)m->size, strerror(errno));
	if (d.sum_kind && !(d.crc = calloc(nchunks ? nchunks : 1, sizeof(*d.crc))))
		return -ENOMEM;
	/* A mismatch is downloaded once more (a byte flipped on the way), then is an error. */
	for (int pass = 0; pass < 2; pass++) {
		if ((rc = sl_download_once(&d)) || !d.sum_kind)
			break;
		sum = nchunks ? d.crc[0] : 0;
		for (uint64_t i = 1; i < nchunks; i++)
			sum = sl__crc_combine(d.sum_kind, sum, d.crc[i],
					      i + 1 < nchunks ? s->part_size : m->size - i * s->part_size);
		if (sum == m->sum)
			break;
		rc = sl__err(SLUICE_EVERIFY, "s3://%s/%s: the %s of the %llu bytes received is %08x, the object's is %08x%s",
			     bucket, key, m->sum_name, (unsigned long long)m->size, sum, m->sum,
			     pass ? " (downloaded twice)" : "");
		sl__warn("s3", "%s", sluice_last_error_detail());
	}
	free(d.crc);
	if (!rc && verified)
		*verified = d.sum_kind != SL_CRC_NONE;
	return rc;
}

/* The process's client from the environment, made once and kept. */
static pthread_mutex_t sl_default_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sl__s3 *sl_default;

int sl__s3_default(struct sl__s3 **out)
{
	int rc = 0;

	pthread_mutex_lock(&sl_default_lock);
	if (!sl_default)
		rc = sl__s3_open(&sl_default, NULL, NULL, NULL);
	*out = sl_default;
	pthread_mutex_unlock(&sl_default_lock);
	return rc;
}
