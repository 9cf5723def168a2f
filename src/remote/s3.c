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
		const char *v = env ? env("SLUICE_S3_RETRIES", ctx) : sl__setting("SLUICE_S3_RETRIES");
		const char *ps = env ? env("SLUICE_S3_PART_SIZE", ctx) : sl__setting("SLUICE_S3_PART_SIZE");
		const char *cc = env ? env("SLUICE_S3_CONCURRENCY", ctx) : sl__setting("SLUICE_S3_CONCURRENCY");
		char *end = NULL;
		unsigned long r = v && *v ? strtoul(v, &end, 10) : 4, n;
		uint64_t part = 8u << 20;

		if (v && *v && (*end || r > 20)) {
			sl__s3_close(s);
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_S3_RETRIES='%s': want 0 to 20 more attempts", v);
		}
		s->retries = (unsigned)r;
		/* S3's bounds: parts of 5 MiB to 5 GiB, the last one smaller. */
		if (ps && *ps && (sluice_parse_size(ps, &part) || part < (5u << 20) || part > (5ull << 30))) {
			sl__s3_close(s);
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_S3_PART_SIZE='%s': want 5M to 5G", ps);
		}
		s->part_size = (size_t)part;
		n = cc && *cc ? strtoul(cc, &end, 10) : 8;
		if (cc && *cc && (*end || n < 1 || n > 256)) {
			sl__s3_close(s);
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_S3_CONCURRENCY='%s': want 1 to 256 parts in flight", cc);
		}
		s->concurrency = (unsigned)n;
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

/* Each thread's connection, kept alive across its requests and closed when the thread ends. */
static pthread_key_t sl_conn_key;
static pthread_once_t sl_conn_once = PTHREAD_ONCE_INIT;

static void sl_conn_free(void *c)
{
	sl__s3_conn_close(c);
}

static void sl_conn_key_init(void)
{
	(void)pthread_key_create(&sl_conn_key, sl_conn_free);
}

struct sl__s3_conn *sl__s3_thread_conn(void)
{
	struct sl__s3_conn *c;

	pthread_once(&sl_conn_once, sl_conn_key_init);
	c = pthread_getspecific(sl_conn_key);
	if (!c && sl__s3_conn_open(&c) == 0 && pthread_setspecific(sl_conn_key, c) != 0) {
		sl__s3_conn_close(c);
		c = NULL;
	}
	return c;
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
	/* Content-Range: bytes FIRST-LAST/TOTAL, as sent ("" if none) and parsed (have_range) */
	char range[96];
	int have_range;
	uint64_t r_first, r_last, r_total;
	/* x-amz-checksum-* values and type, as sent */
	char sum_crc32c[64], sum_crc32[64], sum_other[32], sum_type[32];
	int sum_kind;               /* the body's CRC of this kind into sum as it arrives (0: none) */
	uint32_t sum;
	void (*progress)(void *arg, size_t bytes);
	void *progress_arg;
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
	if (k->sum_kind)
		k->sum = sl__crc(k->sum_kind, k->sum, p, len);
	k->got += len;
	if (k->progress)
		k->progress(k->progress_arg, k->got);
	return len;
}

/* 1 and the header's value (trimmed, cut to cap) into out if the line p (len bytes) is "name: value". */
static int sl_hval(const char *p, size_t len, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name), v, e = len;

	if (len <= nl || p[nl] != ':' || strncasecmp(p, name, nl))
		return 0;
	for (v = nl + 1; v < len && (p[v] == ' ' || p[v] == '\t'); v++)
		;
	while (e > v && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' ' || p[e - 1] == '\t'))
		e--;
	snprintf(out, cap, "%.*s", (int)(e - v), p + v);
	return 1;
}

/* "bytes FIRST-LAST/TOTAL" into k (have_range), digits only, nothing after. */
static void sl_parse_range(struct sl_sink *k)
{
	unsigned long long a, b, t;
	int end = 0;

	k->have_range = sscanf(k->range, "bytes %20llu-%20llu/%20llu%n", &a, &b, &t, &end) == 3 &&
			(size_t)end == strlen(k->range) && strspn(k->range + 6, "0123456789-/") == strlen(k->range + 6) &&
			a <= b && b < t;
	if (k->have_range) {
		k->r_first = a;
		k->r_last = b;
		k->r_total = t;
	}
}

static size_t sl_header(char *p, size_t sz, size_t n, void *arg)
{
	struct sl_sink *k = arg;
	size_t len = sz * n;
	char num[32];

	/* A retry's or a redirect's new head starts over. */
	if (len > 5 && !strncmp(p, "HTTP/", 5)) {
		k->have_size = k->have_range = 0;
		k->range[0] = k->sum_crc32c[0] = k->sum_crc32[0] = k->sum_other[0] = k->sum_type[0] = 0;
	} else if (sl_hval(p, len, "ETag", k->etag, sizeof(k->etag))) {
	} else if (sl_hval(p, len, "Content-Length", num, sizeof(num))) {
		char *end;

		k->size = strtoull(num, &end, 10);
		k->have_size = num[0] >= '0' && num[0] <= '9' && !*end;
	} else if (sl_hval(p, len, "Content-Range", k->range, sizeof(k->range))) {
		sl_parse_range(k);
	} else if (sl_hval(p, len, "x-amz-checksum-crc32c", k->sum_crc32c, sizeof(k->sum_crc32c)) ||
		   sl_hval(p, len, "x-amz-checksum-crc32", k->sum_crc32, sizeof(k->sum_crc32)) ||
		   sl_hval(p, len, "x-amz-checksum-type", k->sum_type, sizeof(k->sum_type))) {
	} else if (len > 16 && !strncasecmp(p, "x-amz-checksum-", 15) && !k->sum_other[0]) {
		const char *c = memchr(p, ':', len);

		if (c)
			snprintf(k->sum_other, sizeof(k->sum_other), "%.*s", (int)(c - p - 15), p + 15);
	}
	return len;
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

enum { SL_HEAD, SL_GET, SL_PUT, SL_POST, SL_DELETE };

/*
 * One request.  GET: [off, off + len) into buf, pinned to if_match when
 * set.  PUT and POST: len bytes of buf as the body (a PUT with key ""
 * creates the bucket); the answer's body (POST, DELETE) lands in the
 * sink's small buffer.  query: "" or "?NAME[=VALUE]&..." after the key.
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

/*
 * A ranged GET's answer against its request (remote.h): 206 with the
 * range asked for (cut only at the object's end) and as many body bytes,
 * or 200 (the Range ignored: the whole object) to a range from byte 0.
 * 0 or -EIO, which sl_request tries again.
 */
static int sl_check_range(const struct sl_req *q, const struct sl_sink *k)
{
	const uint64_t last = q->off + q->len - 1;
	const char *why = NULL;

	if (k->status == 206) {
		if (!k->have_range)
			why = k->range[0] ? "an unreadable Content-Range" : "no Content-Range";
		else if (k->r_first != q->off || k->r_last > last || (k->r_last < last && k->r_last + 1 != k->r_total))
			why = "another range";
		else if (k->got != k->r_last - k->r_first + 1)
			why = "a body of another length";
	} else if (k->status == 200) {
		if (q->off)
			why = "the whole object";
		else if (k->have_size && k->got != k->size)
			why = "a body of another length";
	} else {
		why = "an unexpected status";
	}
	if (!why)
		return 0;
	return sl__err(-EIO, "s3://%s/%s: asked for bytes %llu-%llu, got %s (HTTP %ld, Content-Range '%s', %zu bytes)",
		       q->bucket, q->key, (unsigned long long)q->off, (unsigned long long)last, why, k->status,
		       k->range, k->got);
}

static int sl_request_once(struct sl__s3 *s, struct sl__s3_conn *c, const struct sl_req *q, struct sl_sink *k)
{
	static const char *const verb[] = { "HEAD", "GET", "PUT", "POST", "DELETE" };
	const char *bucket = q->bucket, *key = q->key;
	char url[8192], range[64], match[160];
	struct curl_slist *hdr = NULL;
	CURL *h = c->h;
	CURLcode cc;
	int rc;

	if ((rc = sl_url(s, bucket, key, url, sizeof(url) - 4096)))
		return rc;
	if (q->query && *q->query)
		snprintf(url + strlen(url), sizeof(url) - strlen(url), "%s", q->query);
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
	for (int i = 0; i < 4 && q->hdr[i]; i++)
		hdr = curl_slist_append(hdr, q->hdr[i]);
	if (q->method == SL_HEAD) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
		hdr = curl_slist_append(hdr, "x-amz-checksum-mode: ENABLED");
	} else if (q->method == SL_GET) {
		if (q->len) {
			snprintf(range, sizeof(range), "Range: bytes=%llu-%llu", (unsigned long long)q->off,
				 (unsigned long long)(q->off + q->len - 1));
			hdr = curl_slist_append(hdr, range);
		}
		if (q->if_match && *q->if_match) {
			snprintf(match, sizeof(match), "If-Match: %s", q->if_match);
			hdr = curl_slist_append(hdr, match);
		}
		k->dst = q->buf;
		/* Large reads: fewer, larger receives and callbacks than curl's 16 KiB default. */
		if (q->len >= (1u << 20))
			curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L << 10);
	} else {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, verb[q->method]);
		if (q->method != SL_DELETE) {
			curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->buf ? (const char *)q->buf : "");
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->len);
			hdr = curl_slist_append(hdr, q->method == SL_POST ? "Content-Type: application/xml"
								    : "Content-Type: application/octet-stream");
		}
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	cc = curl_easy_perform(h);
	curl_slist_free_all(hdr);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &k->status);
	k->err[k->errlen] = 0;
	/* CompleteMultipartUpload may fail after its 200 has gone out: the error is then in the body. */
	if (k->status == 200 && q->method == SL_POST && strstr(k->err, "<Error>"))
		k->status = 500;
	if (k->status >= 300) {
		char code[64], msg[256];

		sl__s3_error_parse(k->err, k->errlen, code, sizeof(code), msg, sizeof(msg));
		return sl__err(sl_errno_of_status(k->status), "s3://%s/%s: HTTP %ld%s%s%s%s", bucket, key, k->status,
			       code[0] ? " " : "", code, msg[0] ? ": " : "", msg);
	}
	if (k->overflow)
		return sl__err(-EIO, "s3://%s/%s: the server sent more than the %zu bytes asked for", bucket, key, k->cap);
	if (cc != CURLE_OK)
		return sl__err(sl_errno_of_curl(cc), "s3://%s/%s: %s (curl %d: %s)", bucket, key,
			       c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc), (int)cc, curl_easy_strerror(cc));
	if (q->method == SL_GET && q->len)
		return sl_check_range(q, k);
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
static int sl_request(struct sl__s3 *s, struct sl__s3_conn *c, const struct sl_req *q, struct sl_sink *k)
{
	const char *bucket = q->bucket, *key = q->key;
	const struct sl_sink fresh = *k;
	const unsigned retries = q->min_retries > s->retries ? q->min_retries : s->retries;
	unsigned seed = (unsigned)sl__now_ns() ^ (unsigned)(uintptr_t)c;
	int rc;

	for (unsigned attempt = 0;; attempt++) {
		*k = fresh;
		/* What the failed attempt delivered is void: the receiver starts over (and may not trust it). */
		if (attempt && k->progress)
			k->progress(k->progress_arg, 0);
		rc = sl_request_once(s, c, q, k);
		if (!rc || attempt >= retries || !sl_retryable(rc, k->status))
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
	if (rc && retries && sl_retryable(rc, k->status))
		sl__err(rc, "%s (after %u attempts)", sluice_last_error_detail(), retries + 1);
	return rc;
}

/*
 * The checksum an answer's headers give (remote.h's struct sl__s3_meta):
 * a full-object CRC32C or CRC32 is one a reader can check.  A composite
 * one says so by its type, or by "-N" (its part count) after the value.
 */
static int sl_meta_sum(const struct sl_sink *k, struct sl__s3_meta *m, const char *bucket, const char *key)
{
	const char *v = k->sum_crc32c[0] ? k->sum_crc32c : k->sum_crc32;
	const char *name = k->sum_crc32c[0] ? "crc32c" : "crc32";

	m->sum_kind = SL_CRC_NONE;
	m->sum_name[0] = 0;
	if (!v[0]) {
		if (k->sum_other[0])
			snprintf(m->sum_name, sizeof(m->sum_name), "%.24s (not verified)", k->sum_other);
		return 0;
	}
	if (!strcasecmp(k->sum_type, "COMPOSITE") || strchr(v, '-')) {
		snprintf(m->sum_name, sizeof(m->sum_name), "%s composite (not verified)", name);
		return 0;
	}
	if (sl_b64_u32(v, &m->sum))
		return sl__err(-EIO, "s3://%s/%s: an unreadable x-amz-checksum-%s '%.40s'", bucket, key, name, v);
	m->sum_kind = k->sum_crc32c[0] ? SL_CRC32C : SL_CRC32;
	snprintf(m->sum_name, sizeof(m->sum_name), "%s", name);
	return 0;
}

int sl__s3_head(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key, struct sl__s3_meta *m)
{
	struct sl_req q = { .method = SL_HEAD, .bucket = bucket, .key = key };
	struct sl_sink k = { 0 };
	int rc = sl_request(s, c, &q, &k);

	if (rc)
		return rc;
	if (!k.have_size)
		return sl__err(-EIO, "s3://%s/%s: HEAD answered without a Content-Length", bucket, key);
	m->size = k.size;
	snprintf(m->etag, sizeof(m->etag), "%s", k.etag);
	return sl_meta_sum(&k, m, bucket, key);
}

ssize_t sl__s3_get(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key, uint64_t off,
		   size_t len, void *dst, const char *if_match)
{
	return sl__s3_get_progress(s, c, bucket, key, off, len, dst, if_match, NULL, NULL, 0, NULL);
}

ssize_t sl__s3_get_progress(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			    uint64_t off, size_t len, void *dst, const char *if_match,
			    void (*progress)(void *arg, size_t bytes), void *arg, int sum_kind, uint32_t *sum)
{
	struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = key, .off = off, .len = len, .buf = dst,
			    .if_match = if_match };
	struct sl_sink k = { .cap = len, .progress = progress, .progress_arg = arg, .sum_kind = sum_kind };
	int rc;

	if (!len)
		return 0;
	rc = sl_request(s, c, &q, &k);
	if (!rc && sum)
		*sum = k.sum;
	return rc ? rc : (ssize_t)k.got;
}

int sl__s3_list(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *prefix, const char *delim,
		unsigned max, struct sl__s3_list *l)
{
	char maxs[16];

	enum { CAP = 4 << 20 }; /* a page of 1000 keys of up to 1024 bytes each, escaped, fits */
	char *body = malloc(CAP), query[4096], token[1024] = "";
	int rc = body ? 0 : -ENOMEM;

	do {
		struct sl_req q = { .method = SL_GET, .bucket = bucket, .key = "", .query = query, .buf = body };
		struct sl_sink k = { .cap = CAP };
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

int sl__s3_put(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key, const void *src,
	       size_t len)
{
	struct sl_req q = { .method = SL_PUT, .bucket = bucket, .key = key, .len = len, .buf = (void *)src };
	struct sl_sink k = { 0 };
	char sum[48];

	/* The server checks the bytes it received against the sum and keeps it for readers. */
	if (key[0]) {
		q.hdr[0] = sl_crc_header(sum, sluice_crc32c(0, src, len));
		q.hdr[1] = "x-amz-sdk-checksum-algorithm: CRC32C";
	}
	return sl_request(s, c, &q, &k);
}

int sl__s3_delete(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key)
{
	struct sl_req q = { .method = SL_DELETE, .bucket = bucket, .key = key };
	struct sl_sink k = { 0 };

	return sl_request(s, c, &q, &k);
}

int sl__s3_obj_open(struct sl__s3_obj **out, struct sl__s3 *s3, const char *url, uint64_t *size)
{
	struct sl__s3_obj *o = calloc(1, sizeof(*o));
	struct sl__s3_conn *c = sl__s3_thread_conn();
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
	struct sl__s3_conn *c = NULL;
	char *buf = malloc(u->s->part_size);
	int rc = buf ? sl__s3_conn_open(&c) : -ENOMEM;

	if (rc)
		sl__first_err_keep(&u->fail, rc);
	for (unsigned i; !rc && (i = atomic_fetch_add(&u->next, 1)) < u->nparts;) {
		size_t off = (size_t)i * u->s->part_size, n = u->len - off < u->s->part_size ? u->len - off : u->s->part_size;
		char query[600], sum[48];
		struct sl_req q = { .method = SL_PUT, .bucket = u->bucket, .key = u->key, .query = query, .len = n,
				    .buf = buf };
		struct sl_sink k = { 0 };

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
	sl__s3_conn_close(c);
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
	struct sl__s3_conn *c = sl__s3_thread_conn();
	struct sl_sink k = { 0 };
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
	struct sl__s3_conn *c = NULL;
	char *buf = malloc(chunk);
	int rc = buf ? sl__s3_conn_open(&c) : -ENOMEM;

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
	sl__s3_conn_close(c);
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
