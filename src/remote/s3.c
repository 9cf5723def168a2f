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
 * transport failures -EIO, -ETIMEDOUT, -ECONNREFUSED, SLUICE_ERESOLVE (a host name
 * that does not resolve) or -ECONNRESET (http.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <openssl/evp.h>

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

/* Appends "?name=value" (or "&name=value" after the first) with value encoded; the new length, 0 if it does not fit. */
static size_t sl_query_param(char *out, size_t cap, size_t l, const char *name, const char *value)
{
	size_t n;

	if (l == 0 && cap && out[0] != '?')
		out[0] = 0;
	n = (size_t)snprintf(out + l, cap - l, "%s%s=", l ? "&" : "?", name);
	return n >= cap - l ? 0 : sl__url_encode(out, cap, l + n, value, 0);
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
	if (l >= cap || (*key && !sl__url_encode(out, cap, l, key, 1)))
		return sl__err(SLUICE_EINVAL_CONFIG, "s3://%s/%s: the request URL is too long", bucket, key);
	return 0;
}

static const char sl_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/*
 * n bytes (at most 32: a checksum) in canonical base64 (s, padded) into
 * out; 0 or -1.  Canonical: s is what encoding the bytes gives back, so
 * stray characters, wrong padding and non-zero padding bits are refused.
 */
static int sl_b64_bytes(const char *s, unsigned char *out, unsigned n)
{
	unsigned char buf[48], again[68];
	const size_t len = strlen(s), want = 4 * ((n + 2) / 3);

	if (len != want || want / 4 * 3 > sizeof(buf) ||
	    EVP_DecodeBlock(buf, (const unsigned char *)s, (int)len) != (int)(want / 4 * 3) ||
	    EVP_EncodeBlock(again, buf, (int)n) != (int)len || memcmp(again, s, len))
		return -1;
	memcpy(out, buf, n);
	return 0;
}

/* The 4 bytes a checksum header carries, base64 ("AAAAAA=="), big-endian; 0 or -1. */
static int sl_b64_u32(const char *s, uint32_t *out)
{
	unsigned char b[4];

	if (sl_b64_bytes(s, b, 4))
		return -1;
	*out = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
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
	const struct sl__s3_meta *pin; /* GET: the object as its HEAD said (ETag, size): answers are checked against it */
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
	if (q->pin) {
		h.if_match = h.seen_etag = q->pin->etag;
		h.total = q->pin->size;
		h.total_known = 1;
	}
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
 * a full-object CRC32C, CRC32, CRC64NVME, SHA-1 or SHA-256 is one a
 * reader checks.  A composite one says so by its type, or by "-N" (its
 * part count) after the value.
 */
static int sl_meta_sum(const struct sl__http_resp *k, struct sl__s3_meta *m, const char *bucket, const char *key)
{
	static const struct {
		const char *name;
		int kind, osum;
	} alg[] = { { "crc32c", SL_CRC32C, 0 }, { "crc32", SL_CRC32, 0 }, { "crc64nvme", 0, SL_OSUM_CRC64NVME },
		    { "sha256", 0, SL_OSUM_SHA256 }, { "sha1", 0, SL_OSUM_SHA1 } };
	const char *type = sl__http_kept(k, "type"), *v = "", *other = "";
	unsigned a = 0;

	for (; a < sizeof(alg) / sizeof(alg[0]) && !(v = sl__http_kept(k, alg[a].name))[0]; a++)
		;
	for (unsigned i = 0; i < k->nkept && !other[0]; i++)
		if (strcasecmp(k->kept[i].name, "type"))
			other = k->kept[i].name;

	m->sum_kind = SL_CRC_NONE;
	m->osum_kind = SL_OSUM_NONE;
	m->sum_name[0] = 0;
	if (!v[0]) {
		if (other[0])
			snprintf(m->sum_name, sizeof(m->sum_name), "%.24s (not verified)", other);
		return 0;
	}
	if (!strcasecmp(type, "COMPOSITE") || strchr(v, '-')) {
		snprintf(m->sum_name, sizeof(m->sum_name), "%s composite (not verified)", alg[a].name);
		return 0;
	}
	if (alg[a].kind ? sl_b64_u32(v, &m->sum) : sl_b64_bytes(v, m->osum, sl__osum_len(alg[a].osum)))
		return sl__err(-EIO, "s3://%s/%s: an unreadable x-amz-checksum-%s '%.60s'", bucket, key, alg[a].name, v);
	m->sum_kind = alg[a].kind;
	m->osum_kind = alg[a].osum;
	snprintf(m->sum_name, sizeof(m->sum_name), "%s", alg[a].name);
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
	struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = key, .off = off, .len = len, .buf = dst,
			    .if_match = if_match };
	struct sl__http_resp k = { .cap = len };
	int rc = len ? sl_request(s, c, &q, &k) : 0;

	return rc ? rc : (ssize_t)k.got;
}

ssize_t sl__s3_get_progress(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
			    uint64_t off, size_t len, void *dst, const struct sl__s3_meta *pin,
			    void (*progress)(void *arg, size_t bytes), void *arg, int sum_kind, uint64_t *sum)
{
	struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = key, .off = off, .len = len, .buf = dst,
			    .pin = pin };
	struct sl__http_resp k = { .cap = len, .progress = progress, .progress_arg = arg, .sum_kind = sum_kind };
	int rc;

	if (!len)
		return 0;
	rc = sl_request(s, c, &q, &k);
	if (!rc && sum)
		*sum = k.sum;
	return rc ? rc : (ssize_t)k.got;
}

ssize_t sl__s3_get_object(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, void *dst,
			  size_t cap, uint64_t *size)
{
	struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = key, .buf = dst,
			    .hdr = { "x-amz-checksum-mode: ENABLED" } };
	int rc = 0;

	*size = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		struct sl__http_resp k = { .cap = cap };
		struct sl__s3_meta m;
		uint32_t got;

		rc = sl_request(s, c, &q, &k);
		*size = k.have_size ? k.size : 0;
		if (rc)
			return rc;
		if (!k.have_size || k.got != k.size)
			return sl__err(-EIO, "s3://%s/%s: a body of %zu bytes under a Content-Length of %s", bucket, key,
				       k.got, k.have_size ? "another length" : "none");
		if ((rc = sl_meta_sum(&k, &m, bucket, key)))
			return rc;
		if (m.osum_kind) {
			char name[1200];

			snprintf(name, sizeof(name), "s3://%s/%s", bucket, key);
			if ((rc = sl__osum_check(&m, dst, k.got, name)) >= 0)
				return (ssize_t)k.got;
			if (rc != SLUICE_EVERIFY)
				return rc;
			sl__err(rc, "%s (read twice)", sluice_last_error_detail());
			continue;
		}
		if (!m.sum_kind || (got = sl__crc(m.sum_kind, 0, dst, k.got)) == m.sum)
			return (ssize_t)k.got;
		rc = sl__err(SLUICE_EVERIFY, "s3://%s/%s: its %s is %08x, the bytes read give %08x (read twice)", bucket,
			     key, m.sum_name, m.sum, got);
	}
	return rc;
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

/* ---- Multipart uploads, one request each (s3xfer.c runs them) ---- */

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

size_t sl__s3_part_size(const struct sl__s3 *s)
{
	return s->part_size;
}

unsigned sl__s3_concurrency(const struct sl__s3 *s)
{
	return s->concurrency;
}

int sl__s3_mpu_create(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, char *id,
		      size_t cap)
{
	/* The object's checksum will be the CRC32C of all its bytes, not one of the parts' sums. */
	struct sl_req q = { .method = SL_POST, .bucket = bucket, .key = key, .query = "?uploads=",
			    .hdr = { "x-amz-checksum-algorithm: CRC32C", "x-amz-checksum-type: FULL_OBJECT" } };
	struct sl__http_resp k = { 0 };
	char raw[400];
	int rc = sl_request(s, c, &q, &k);

	if (!rc && sl_xml_text(k.err, "UploadId", raw, sizeof(raw)))
		rc = sl__err(-EIO, "s3://%s/%s: CreateMultipartUpload answered without an UploadId", bucket, key);
	if (!rc && (cap < 10 || !sl__url_encode(id, cap, (size_t)snprintf(id, cap, "uploadId="), raw, 0)))
		rc = sl__err(-EIO, "s3://%s/%s: an UploadId of %zu characters", bucket, key, strlen(raw));
	return rc;
}

int sl__s3_mpu_part(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, const char *id,
		    unsigned part, const void *buf, size_t n, uint32_t crc, char etag[128])
{
	char query[600], sum[48];
	struct sl_req q = { .method = SL_PUT, .bucket = bucket, .key = key, .query = query, .len = n, .buf = (void *)buf };
	struct sl__http_resp k = { 0 };
	int rc;

	snprintf(query, sizeof(query), "?partNumber=%u&%s", part, id);
	q.hdr[0] = sl_crc_header(sum, crc);
	rc = sl_request(s, c, &q, &k);
	if (!rc && !k.etag[0])
		rc = sl__err(-EIO, "s3://%s/%s: part %u answered without an ETag", bucket, key, part);
	if (!rc)
		memcpy(etag, k.etag, 128);
	return rc;
}

/* Complete: every part, in order, with its ETag (quotes escaped for XML) and CRC32C, and the whole's. */
int sl__s3_mpu_complete(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, const char *id,
			unsigned nparts, char (*etag)[128], const uint32_t *crc, uint32_t whole)
{
	size_t cap = 64 + (size_t)nparts * 260, l;
	struct sl_req q = { .method = SL_POST, .bucket = bucket, .key = key };
	struct sl__http_resp k = { 0 };
	char query[600], sum[48], b64[9], *xml = malloc(cap);
	int rc;

	if (!xml)
		return -ENOMEM;
	q.hdr[0] = sl_crc_header(sum, whole);
	q.hdr[1] = "x-amz-checksum-type: FULL_OBJECT";
	l = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
	for (unsigned i = 0; i < nparts; i++) {
		sl_u32_b64(crc[i], b64);
		l += (size_t)snprintf(xml + l, cap - l,
				      "<Part><PartNumber>%u</PartNumber><ChecksumCRC32C>%s</ChecksumCRC32C><ETag>", i + 1, b64);
		for (const char *e = etag[i]; *e; e++)
			l += (size_t)snprintf(xml + l, cap - l, "%s", *e == '"' ? "&quot;" : (char[2]){ *e, 0 });
		l += (size_t)snprintf(xml + l, cap - l, "</ETag></Part>");
	}
	l += (size_t)snprintf(xml + l, cap - l, "</CompleteMultipartUpload>");
	snprintf(query, sizeof(query), "?%s", id);
	q.query = query;
	q.buf = xml;
	q.len = l;
	rc = sl_request(s, c, &q, &k);
	free(xml);
	return rc;
}

void sl__s3_mpu_abort(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, const char *id)
{
	char query[600];
	/* The abort is what keeps the store clean: it gets at least 4 more tries, whatever the setting. */
	struct sl_req q = { .method = SL_DELETE, .bucket = bucket, .key = key, .query = query, .min_retries = 4 };
	struct sl__http_resp k = { 0 };

	snprintf(query, sizeof(query), "?%s", id);
	if (sl_request(s, c, &q, &k))
		sl__warn("s3", "s3://%s/%s: aborting the multipart upload failed: %s", bucket, key, sluice_last_error_detail());
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
