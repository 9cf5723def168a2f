/*
 * S3 requests over libcurl: one object's size and ETag (HEAD), a byte range
 * of it into memory (GET with Range, optionally pinned to an ETag with
 * If-Match), a whole object or a bucket created (PUT).  Requests are signed
 * with Signature V4 by curl (CURLOPT_AWS_SIGV4) with the payload unsigned,
 * as S3 allows; the secret goes to curl and nowhere else.  Each call runs
 * on an easy handle the caller keeps (struct sl__s3_conn), so its
 * connection is kept alive from one request to the next.
 *
 * Errors carry the object's URL, the HTTP status and the server's own code
 * (NoSuchKey, AccessDenied, SignatureDoesNotMatch, ...), mapped to errno:
 * 404 -ENOENT, 403 -EACCES, 412 -ESTALE (the object changed), 416 -ERANGE,
 * transport failures -EIO, -ETIMEDOUT, -ECONNREFUSED or -ECONNRESET.
 */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "remote/remote.h"

struct sl__s3 {
	struct sl__s3_conf conf;
	char sigv4[96];              /* "aws:amz:REGION:s3" */
	char userpwd[400];           /* "ACCESS:SECRET" for curl; cleared at close */
	char token_header[4200];     /* "x-amz-security-token: ..." or "" */
	unsigned retries;            /* more attempts after a retryable failure (SLUICE_S3_RETRIES) */
};

struct sl__s3_conn {
	CURL *h;
	char errbuf[CURL_ERROR_SIZE];
};

static pthread_once_t sl_curl_once = PTHREAD_ONCE_INIT;
static int sl_curl_ok;

static void sl_curl_init(void)
{
	sl_curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

int sl__s3_open(struct sl__s3 **out, const struct sl__s3_args *args, sl__env_fn env, void *ctx)
{
	struct sl__s3 *s;
	int rc;

	*out = NULL;
	pthread_once(&sl_curl_once, sl_curl_init);
	if (!sl_curl_ok)
		return sl__err(-EIO, "libcurl could not be initialised");
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
		const char *v = env ? env("SLUICE_S3_RETRIES", ctx) : getenv("SLUICE_S3_RETRIES");
		char *end = NULL;
		unsigned long r = v && *v ? strtoul(v, &end, 10) : 4;

		if (v && *v && (*end || r > 20)) {
			sl__s3_close(s);
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_S3_RETRIES='%s': want 0 to 20 more attempts", v);
		}
		s->retries = (unsigned)r;
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

int sl__s3_conn_open(struct sl__s3_conn **out)
{
	struct sl__s3_conn *c = calloc(1, sizeof(*c));

	*out = NULL;
	if (!c)
		return -ENOMEM;
	c->h = curl_easy_init();
	if (!c->h) {
		free(c);
		return sl__err(-ENOMEM, "curl_easy_init failed");
	}
	*out = c;
	return 0;
}

void sl__s3_conn_close(struct sl__s3_conn *c)
{
	if (!c)
		return;
	curl_easy_cleanup(c->h);
	free(c);
}

/* Appends s to out (cap bytes at out, l used), percent-encoding all but unreserved characters and, in keys, '/'. */
static size_t sl_url_encode(char *out, size_t cap, size_t l, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";

	for (; *s && l + 4 < cap; s++) {
		unsigned char ch = (unsigned char)*s;

		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
		    ch == '_' || ch == '.' || ch == '~' || ch == '/') {
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

/* The request URL of bucket/key, path-style or virtual-host; 0 or an error if it does not fit. */
static int sl_url(const struct sl__s3 *s, const char *bucket, const char *key, char *out, size_t cap)
{
	const char *ep = s->conf.endpoint, *host = strstr(ep, "://") + 3;
	size_t l;

	if (s->conf.path_style)
		l = (size_t)snprintf(out, cap, "%s/%s/", ep, bucket);
	else
		l = (size_t)snprintf(out, cap, "%.*s%s.%s/", (int)(host - ep), ep, bucket, host);
	if (l >= cap || (*key && !sl_url_encode(out, cap, l, key)))
		return sl__err(SLUICE_EINVAL_CONFIG, "s3://%s/%s: the request URL is too long", bucket, key);
	return 0;
}

/* What a response body goes to: the caller's range, or (errors) a small buffer for the server's XML. */
struct sl_sink {
	char *dst;
	size_t cap, got;
	int overflow;
	char err[4096];
	size_t errlen;
	long status;
	CURL *h;
	char etag[128];
	uint64_t size;
	int have_size;
};

static size_t sl_body(char *p, size_t sz, size_t n, void *arg)
{
	struct sl_sink *k = arg;
	size_t len = sz * n;

	if (!k->status)
		curl_easy_getinfo(k->h, CURLINFO_RESPONSE_CODE, &k->status);
	if (k->status >= 300 || !k->dst) {
		size_t room = sizeof(k->err) - 1 - k->errlen;

		memcpy(k->err + k->errlen, p, len < room ? len : room);
		k->errlen += len < room ? len : room;
		return len;
	}
	if (len > k->cap - k->got) {
		k->overflow = 1;
		return 0; /* more than the range asked for: stop */
	}
	memcpy(k->dst + k->got, p, len);
	k->got += len;
	return len;
}

static size_t sl_header(char *p, size_t sz, size_t n, void *arg)
{
	struct sl_sink *k = arg;
	size_t len = sz * n, v;

	if (len > 5 && !strncasecmp(p, "ETag:", 5)) {
		for (v = 5; v < len && (p[v] == ' ' || p[v] == '\t'); v++)
			;
		size_t e = len;

		while (e > v && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' '))
			e--;
		snprintf(k->etag, sizeof(k->etag), "%.*s", (int)(e - v), p + v);
	} else if (len > 15 && !strncasecmp(p, "Content-Length:", 15)) {
		char num[32];

		snprintf(num, sizeof(num), "%.*s", (int)(len - 15 < 31 ? len - 15 : 31), p + 15);
		k->size = strtoull(num, NULL, 10);
		k->have_size = 1;
	}
	return len;
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

static int sl_errno_of_status(long status)
{
	switch (status) {
	case 404:
		return -ENOENT;
	case 403:
		return -EACCES;
	case 412:
		return -ESTALE;
	case 416:
		return -ERANGE;
	default:
		return -EIO;
	}
}

static int sl_errno_of_curl(CURLcode cc)
{
	switch (cc) {
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
		return -ECONNRESET;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	default:
		return -EIO;
	}
}

enum { SL_HEAD, SL_GET, SL_PUT };

/*
 * One request.  GET: [off, off + len) into dst (len 0: the whole object
 * into dst's cap).  PUT: len bytes of src (key "" creates the bucket).
 */
static int sl_request_once(struct sl__s3 *s, struct sl__s3_conn *c, int method, const char *bucket,
			   const char *key, uint64_t off, size_t len, void *buf, const char *if_match, struct sl_sink *k)
{
	char url[2048], range[64], match[160];
	struct curl_slist *hdr = NULL;
	CURL *h = c->h;
	CURLcode cc;
	int rc;

	if ((rc = sl_url(s, bucket, key, url, sizeof(url))))
		return rc;
	curl_easy_reset(h);
	k->h = h;
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	/* A stalled transfer (under 1 KiB/s for 30 s) is a timeout, not a hang. */
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sl_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, k);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, sl_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, k);
	c->errbuf[0] = 0;
	if (!s->conf.anonymous) {
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
		curl_easy_setopt(h, CURLOPT_USERPWD, s->userpwd);
		/* The payload is not hashed into the signature (curl cannot hash a body it streams). */
		hdr = curl_slist_append(hdr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
		if (s->token_header[0])
			hdr = curl_slist_append(hdr, s->token_header);
	}
	if (method == SL_HEAD) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (method == SL_GET) {
		if (len) {
			snprintf(range, sizeof(range), "Range: bytes=%llu-%llu", (unsigned long long)off,
				 (unsigned long long)(off + len - 1));
			hdr = curl_slist_append(hdr, range);
		}
		if (if_match && *if_match) {
			snprintf(match, sizeof(match), "If-Match: %s", if_match);
			hdr = curl_slist_append(hdr, match);
		}
		k->dst = buf;
	} else {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, buf ? buf : "");
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
		hdr = curl_slist_append(hdr, "Content-Type: application/octet-stream");
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	cc = curl_easy_perform(h);
	curl_slist_free_all(hdr);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &k->status);
	if (k->status >= 300) {
		char code[64], msg[256];

		k->err[k->errlen] = 0;
		sl__s3_error_parse(k->err, k->errlen, code, sizeof(code), msg, sizeof(msg));
		return sl__err(sl_errno_of_status(k->status), "s3://%s/%s: HTTP %ld%s%s%s%s", bucket, key, k->status,
			       code[0] ? " " : "", code, msg[0] ? ": " : "", msg);
	}
	if (k->overflow)
		return sl__err(-EIO, "s3://%s/%s: the server sent more than the %zu bytes asked for", bucket, key, k->cap);
	if (cc != CURLE_OK)
		return sl__err(sl_errno_of_curl(cc), "s3://%s/%s: %s (curl %d: %s)", bucket, key,
			       c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc), (int)cc, curl_easy_strerror(cc));
	return 0;
}

/* Worth another try: the server busy or failing (5xx, 429), the connection lost or stalled. */
static int sl_retryable(int rc, long status)
{
	if (status >= 300)
		return status == 429 || status >= 500;
	return rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EIO;
}

/*
 * A request with bounded retries: up to s->retries more attempts, each
 * after a random wait of up to 100 ms x 2^attempt (capped at 5 s: "full
 * jitter", so that many workers retrying at once do not come back in
 * step).  A GET's range is received again from its start.  The last
 * error is returned, saying how many attempts were made.
 */
static int sl_request(struct sl__s3 *s, struct sl__s3_conn *c, int method, const char *bucket, const char *key,
		      uint64_t off, size_t len, void *buf, const char *if_match, struct sl_sink *k)
{
	const struct sl_sink fresh = *k;
	unsigned seed = (unsigned)sl__now_ns() ^ (unsigned)(uintptr_t)c;
	int rc;

	for (unsigned attempt = 0;; attempt++) {
		*k = fresh;
		rc = sl_request_once(s, c, method, bucket, key, off, len, buf, if_match, k);
		if (!rc || attempt >= s->retries || !sl_retryable(rc, k->status))
			break;
		uint64_t cap_ms = 100ull << (attempt < 6 ? attempt : 6), wait_ms;

		if (cap_ms > 5000)
			cap_ms = 5000;
		wait_ms = (uint64_t)rand_r(&seed) % (cap_ms + 1);
		sl__debug("s3", "s3://%s/%s: attempt %u failed (%s); again in %llu ms", bucket, key, attempt + 1,
			  sluice_last_error_detail(), (unsigned long long)wait_ms);
		struct timespec ts = { (time_t)(wait_ms / 1000), (long)(wait_ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	if (rc && s->retries && sl_retryable(rc, k->status))
		sl__err(rc, "%s (after %u attempts)", sluice_last_error_detail(), s->retries + 1);
	return rc;
}

int sl__s3_head(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key, uint64_t *size,
		char *etag, size_t etag_cap)
{
	struct sl_sink k = { 0 };
	int rc = sl_request(s, c, SL_HEAD, bucket, key, 0, 0, NULL, NULL, &k);

	if (rc)
		return rc;
	if (!k.have_size)
		return sl__err(-EIO, "s3://%s/%s: HEAD answered without a Content-Length", bucket, key);
	*size = k.size;
	if (etag && etag_cap)
		snprintf(etag, etag_cap, "%s", k.etag);
	return 0;
}

ssize_t sl__s3_get(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key, uint64_t off,
		   size_t len, void *dst, const char *if_match)
{
	struct sl_sink k = { .cap = len };
	int rc;

	if (!len)
		return 0;
	rc = sl_request(s, c, SL_GET, bucket, key, off, len, dst, if_match, &k);
	if (rc)
		return rc;
	/* 200 instead of 206 means the Range was ignored: the body would start at byte 0. */
	if (k.status != 206 && !(k.status == 200 && off == 0))
		return sl__err(-EIO, "s3://%s/%s: HTTP %ld to a range request", bucket, key, k.status);
	return (ssize_t)k.got;
}

int sl__s3_put(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key, const void *src,
	       size_t len)
{
	struct sl_sink k = { 0 };

	return sl_request(s, c, SL_PUT, bucket, key, 0, len, (void *)src, NULL, &k);
}

int sl__s3_obj_open(struct sl__s3_obj **out, struct sl__s3 *s3, const char *url, uint64_t *size)
{
	struct sl__s3_obj *o = calloc(1, sizeof(*o));
	struct sl__s3_conn *c = NULL;
	int rc;

	*out = NULL;
	if (!o)
		return -ENOMEM;
	o->s3 = s3;
	rc = sl__s3_parse_url(url, o->bucket, sizeof(o->bucket), o->key, sizeof(o->key));
	if (!rc && !o->key[0])
		rc = sl__err(-EISDIR, "%s: names a bucket or prefix, not an object", url);
	if (!rc)
		rc = sl__s3_conn_open(&c);
	if (!rc)
		rc = sl__s3_head(s3, c, o->bucket, o->key, size, o->etag, sizeof(o->etag));
	sl__s3_conn_close(c);
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
