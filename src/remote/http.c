/*
 * HTTP requests over libcurl: the transport under the s3 and http stores.
 * Each request runs on an easy handle the caller keeps (struct
 * sl__http_conn), so its connection is kept alive from one request to the
 * next.  A ranged GET's answer is checked against its request (status,
 * Content-Range, body length), and failed or mismatched answers are tried
 * again a bounded number of times.
 *
 * Errors name what was asked (req->name), the HTTP status and the
 * server's own words where the caller can read them (req->describe), mapped
 * to errno: 404 -ENOENT, 403 -EACCES, 412 -ESTALE (the resource changed),
 * 416 -ERANGE, transport failures -EIO, -ETIMEDOUT, -ECONNREFUSED or
 * -ECONNRESET.
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

struct sl__http_conn {
	CURL *h;
	char errbuf[CURL_ERROR_SIZE];
};

static pthread_once_t sl_curl_once = PTHREAD_ONCE_INIT;
static int sl_curl_ok;

static void sl_curl_init(void)
{
	sl_curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

int sl__http_init(void)
{
	pthread_once(&sl_curl_once, sl_curl_init);
	return sl_curl_ok ? 0 : sl__err(-EIO, "libcurl could not be initialised");
}

int sl__http_conn_open(struct sl__http_conn **out)
{
	struct sl__http_conn *c;
	int rc = sl__http_init();

	*out = NULL;
	if (rc)
		return rc;
	if (!(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->h = curl_easy_init();
	if (!c->h) {
		free(c);
		return sl__err(-ENOMEM, "curl_easy_init failed");
	}
	*out = c;
	return 0;
}

void sl__http_conn_close(struct sl__http_conn *c)
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
	sl__http_conn_close(c);
}

static void sl_conn_key_init(void)
{
	(void)pthread_key_create(&sl_conn_key, sl_conn_free);
}

struct sl__http_conn *sl__http_thread_conn(void)
{
	struct sl__http_conn *c;

	pthread_once(&sl_conn_once, sl_conn_key_init);
	c = pthread_getspecific(sl_conn_key);
	if (!c && sl__http_conn_open(&c) == 0 && pthread_setspecific(sl_conn_key, c) != 0) {
		sl__http_conn_close(c);
		c = NULL;
	}
	return c;
}

/* The body: the caller's range (k->dst), or (errors, small answers) k->err. */
static size_t sl_body(char *p, size_t sz, size_t n, void *arg)
{
	struct sl__http_resp *k = arg;
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
static void sl_parse_range(struct sl__http_resp *k)
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

/* Headers whose name starts with k->keep ("x-amz-checksum-"): the rest of the name and the value. */
static void sl_keep(struct sl__http_resp *k, const char *p, size_t len)
{
	size_t pl = strlen(k->keep);
	const char *c = memchr(p, ':', len);
	char name[96];

	if (!c || (size_t)(c - p) <= pl || (size_t)(c - p) >= sizeof(name) || k->nkept == SL_HTTP_KEPT)
		return;
	snprintf(name, sizeof(name), "%.*s", (int)(c - p), p);
	snprintf(k->kept[k->nkept].name, sizeof(k->kept[0].name), "%s", name + pl);
	sl_hval(p, len, name, k->kept[k->nkept].value, sizeof(k->kept[0].value));
	k->nkept++;
}

static size_t sl_header(char *p, size_t sz, size_t n, void *arg)
{
	struct sl__http_resp *k = arg;
	size_t len = sz * n;
	char num[32];

	/* A retry's or a redirect's new head starts over. */
	if (len > 5 && !strncmp(p, "HTTP/", 5)) {
		k->have_size = k->have_range = 0;
		k->range[0] = k->etag[0] = k->last_modified[0] = 0;
		k->nkept = 0;
	} else if (sl_hval(p, len, "ETag", k->etag, sizeof(k->etag))) {
	} else if (sl_hval(p, len, "Last-Modified", k->last_modified, sizeof(k->last_modified))) {
	} else if (sl_hval(p, len, "Content-Length", num, sizeof(num))) {
		char *end;

		k->size = strtoull(num, &end, 10);
		k->have_size = num[0] >= '0' && num[0] <= '9' && !*end;
	} else if (sl_hval(p, len, "Content-Range", k->range, sizeof(k->range))) {
		sl_parse_range(k);
	} else if (k->keep && len > strlen(k->keep) && !strncasecmp(p, k->keep, strlen(k->keep))) {
		sl_keep(k, p, len);
	}
	return len;
}

const char *sl__http_kept(const struct sl__http_resp *k, const char *name)
{
	for (unsigned i = 0; i < k->nkept; i++)
		if (!strcasecmp(k->kept[i].name, name))
			return k->kept[i].value;
	return "";
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
	case CURLE_COULDNT_RESOLVE_HOST:
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

/*
 * A ranged GET's answer against its request: 206 with the range asked for
 * (cut only at the resource's end) and as many body bytes, or 200 (the
 * Range ignored: the whole resource) to a range from byte 0.  0 or -EIO,
 * which sl__http_request tries again.
 */
static int sl_check_range(const struct sl__http_req *q, const struct sl__http_resp *k)
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
	return sl__err(-EIO, "%s: asked for bytes %llu-%llu, got %s (HTTP %ld, Content-Range '%s', %zu bytes)", q->name,
		       (unsigned long long)q->off, (unsigned long long)last, why, k->status, k->range, k->got);
}

/* The request's headers, curl's list of them. */
static struct curl_slist *sl_headers(const struct sl__http_req *q, char range[64], char match[160])
{
	struct curl_slist *hdr = NULL;

	for (int i = 0; i < SL_HTTP_HDRS && q->hdr[i]; i++)
		hdr = curl_slist_append(hdr, q->hdr[i]);
	if (q->method == SL_HTTP_GET && q->len) {
		snprintf(range, 64, "Range: bytes=%llu-%llu", (unsigned long long)q->off,
			 (unsigned long long)(q->off + q->len - 1));
		hdr = curl_slist_append(hdr, range);
	}
	if (q->method == SL_HTTP_GET && q->if_match && *q->if_match) {
		snprintf(match, 160, "If-Match: %s", q->if_match);
		hdr = curl_slist_append(hdr, match);
	}
	if (q->method == SL_HTTP_PUT || q->method == SL_HTTP_POST)
		hdr = curl_slist_append(hdr, q->method == SL_HTTP_POST ? "Content-Type: application/xml"
								 : "Content-Type: application/octet-stream");
	return hdr;
}

static void sl_setopts(CURL *h, struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	static const char *const verb[] = { "HEAD", "GET", "PUT", "POST", "DELETE" };

	curl_easy_reset(h);
	k->h = h;
	curl_easy_setopt(h, CURLOPT_URL, q->url);
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
	if (q->follow) {
		curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
		curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
	}
	if (q->sigv4) {
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, q->sigv4);
		curl_easy_setopt(h, CURLOPT_USERPWD, q->userpwd);
	}
	if (q->method == SL_HTTP_HEAD) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (q->method == SL_HTTP_GET) {
		k->dst = q->buf;
		/* Large reads: fewer, larger receives and callbacks than curl's 16 KiB default. */
		if (q->len >= (1u << 20))
			curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L << 10);
	} else {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, verb[q->method]);
		if (q->method != SL_HTTP_DELETE) {
			curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->buf ? (const char *)q->buf : "");
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->len);
		}
	}
}

static int sl_request_once(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	char range[64], match[160];
	struct curl_slist *hdr = sl_headers(q, range, match);
	CURL *h = c->h;
	CURLcode cc;

	sl_setopts(h, c, q, k);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	cc = curl_easy_perform(h);
	curl_slist_free_all(hdr);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &k->status);
	k->err[k->errlen] = 0;
	if (q->status_of)
		k->status = q->status_of(q, k);
	if (k->status >= 300) {
		char said[400] = "";

		if (q->describe)
			q->describe(k->err, k->errlen, said, sizeof(said));
		return sl__err(sl_errno_of_status(k->status), "%s: HTTP %ld%s", q->name, k->status, said);
	}
	if (k->overflow)
		return sl__err(-EIO, "%s: the server sent more than the %zu bytes asked for", q->name, k->cap);
	if (cc != CURLE_OK)
		return sl__err(sl_errno_of_curl(cc), "%s: %s (curl %d: %s)", q->name,
			       c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc), (int)cc, curl_easy_strerror(cc));
	if (q->method == SL_HTTP_GET && q->len)
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

int sl__http_request(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	const struct sl__http_resp fresh = *k;
	unsigned seed = (unsigned)sl__now_ns() ^ (unsigned)(uintptr_t)c;
	int rc;

	for (unsigned attempt = 0;; attempt++) {
		*k = fresh;
		/* What the failed attempt delivered is void: the receiver starts over (and may not trust it). */
		if (attempt && k->progress)
			k->progress(k->progress_arg, 0);
		rc = sl_request_once(c, q, k);
		if (!rc || attempt >= q->retries || !sl_retryable(rc, k->status))
			break;
		uint64_t cap_ms = 100ull << (attempt < 6 ? attempt : 6), wait_ms;

		if (cap_ms > 5000)
			cap_ms = 5000;
		wait_ms = (uint64_t)rand_r(&seed) % (cap_ms + 1);
		sl__debug("http", "%s: attempt %u failed (%s); again in %llu ms", q->name, attempt + 1,
			  sluice_last_error_detail(), (unsigned long long)wait_ms);
		struct timespec ts = { (time_t)(wait_ms / 1000), (long)(wait_ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	if (rc && q->retries && sl_retryable(rc, k->status))
		sl__err(rc, "%s (after %u attempts)", sluice_last_error_detail(), q->retries + 1);
	return rc;
}
