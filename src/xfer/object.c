/*
 * The object-store client of the public API (sluice_s3_*): read_to_gpu
 * and write_from_gpu by bucket and key, and their async forms, over an S3
 * client with its own endpoint and credentials, on the engine's pipeline
 * (file.c's s3:// paths, remote/).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer/xfer.h"

struct sluice_s3 {
	struct sluice_engine *eng;
	struct sluice_engine *own;  /* the engine opened for this client (sluice_s3_open_config), closed with it */
	struct sl__s3 *s3;
	/* sluice_s3_get_many's kept-alive connections, between calls. */
	pthread_mutex_t lock;
	struct sl__http_conn *idle[SLUICE_S3_MAX_IN_FLIGHT];
	unsigned nidle;
};

int sluice_s3_open(struct sluice_s3 **out, struct sluice_engine *eng, const char *endpoint, const char *access_key,
		   const char *secret_key, const char *region)
{
	struct sl__s3_args a = { .endpoint = endpoint, .access_key = access_key, .secret_key = secret_key,
				 .region = region };
	struct sluice_s3 *c;
	int rc;

	*out = NULL;
	sl__err_clear();
	if (!eng)
		return sl__err(SLUICE_EINVAL_CONFIG, "an object client needs an engine (or sluice_s3_open_config)");
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->eng = eng;
	rc = sl__s3_open(&c->s3, &a, NULL, NULL);
	if (rc) {
		free(c);
		return rc;
	}
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

int sluice_s3_open_config(struct sluice_s3 **out, const struct sluice_config *cfg, const char *endpoint,
			  const char *access_key, const char *secret_key, const char *region)
{
	struct sluice_engine *eng;
	int rc;

	*out = NULL;
	if ((rc = sluice_engine_open(&eng, cfg)))
		return rc;
	if ((rc = sluice_s3_open(out, eng, endpoint, access_key, secret_key, region))) {
		sluice_engine_close(eng);
		return rc;
	}
	(*out)->own = eng;
	return 0;
}

void sluice_s3_close(struct sluice_s3 *c)
{
	if (!c)
		return;
	sl__s3_close(c->s3);
	for (unsigned i = 0; i < c->nidle; i++)
		sl__http_conn_close(c->idle[i]);
	pthread_mutex_destroy(&c->lock);
	sluice_engine_close(c->own);
	free(c);
}

/* ---- Many small objects: GETs in flight on connections the client keeps between calls ---- */

struct sl_many {
	struct sluice_s3 *c;
	const char *bucket;
	struct sluice_s3_object *objs;
	size_t n;
	_Atomic size_t next;
	struct sl__first_err fail;
};

static struct sl__http_conn *sl_conn_take(struct sluice_s3 *c)
{
	struct sl__http_conn *h = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->nidle)
		h = c->idle[--c->nidle];
	pthread_mutex_unlock(&c->lock);
	if (!h && sl__http_conn_open(&h))
		h = NULL;
	return h;
}

static void sl_conn_give(struct sluice_s3 *c, struct sl__http_conn *h)
{
	pthread_mutex_lock(&c->lock);
	if (h && c->nidle < SLUICE_S3_MAX_IN_FLIGHT) {
		c->idle[c->nidle++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	sl__http_conn_close(h);
}

static void *sl_many_run(void *arg)
{
	struct sl_many *m = arg;
	struct sl__http_conn *h = sl_conn_take(m->c);

	for (size_t i; (i = atomic_fetch_add(&m->next, 1)) < m->n;) {
		struct sluice_s3_object *o = &m->objs[i];

		o->result = !h ? -ENOMEM
			    : !o->key || (!o->buf && o->cap)
				    ? sl__err(-EINVAL, "object %zu: want a key and a buffer", i)
				    : sl__s3_get_object(m->c->s3, h, m->bucket, o->key, o->buf, o->cap, &o->size);
		sl__first_err_keep(&m->fail, o->result < 0 ? (int)o->result : 0);
	}
	sl_conn_give(m->c, h);
	return NULL;
}

int sluice_s3_get_many(struct sluice_s3 *c, const char *bucket, struct sluice_s3_object *objs, size_t n,
		       unsigned in_flight)
{
	struct sl_many m = { .c = c, .bucket = bucket, .objs = objs, .n = n };
	int rc;

	sl__err_clear();
	if (!c || !bucket || (!objs && n))
		return sl__err(-EINVAL, "sluice_s3_get_many: want a client, a bucket and the objects");
	if (!in_flight)
		in_flight = 64;
	if (in_flight > SLUICE_S3_MAX_IN_FLIGHT)
		in_flight = SLUICE_S3_MAX_IN_FLIGHT;
	sl__first_err_init(&m.fail);
	sl__fanout((unsigned)(n < in_flight ? n : in_flight), sl_many_run, &m);
	rc = sl__first_err_raise(&m.fail);
	sl__first_err_fini(&m.fail);
	return rc;
}

/* s3://bucket/key, or an error naming what does not fit. */
static int sl_object_url(char *url, size_t cap, const char *bucket, const char *key)
{
	if (!bucket || !key || (size_t)snprintf(url, cap, "s3://%s/%s", bucket, key) >= cap)
		return sl__err(SLUICE_EINVAL_CONFIG, "bucket and key: want a bucket name and a key of at most 1024 bytes");
	return 0;
}

/* Opens bucket/key through the client, as the engine opens an s3:// path. */
static int sl_object_open(struct sluice_s3 *c, const char *bucket, const char *key, struct sluice_file **f)
{
	char url[1200];
	int rc;

	sl__err_clear();
	*f = NULL;
	if ((rc = sl_object_url(url, sizeof(url), bucket, key)))
		return rc;
	return sl__file_open(f, c->eng, c->s3, url, SLUICE_RDONLY);
}

ssize_t sluice_s3_read_to_gpu(struct sluice_s3 *c, const char *bucket, const char *key, void *dst, uint64_t offset,
			      size_t len, struct sluice_xfer_report *rep)
{
	struct sluice_file *f;
	ssize_t rc = sl_object_open(c, bucket, key, &f);

	if (rc)
		return rc;
	rc = sluice_file_read(f, offset, len, dst, rep);
	sluice_file_close(f);
	return rc;
}

ssize_t sluice_s3_write_from_gpu(struct sluice_s3 *c, const char *bucket, const char *key, const void *src,
				 size_t len, struct sluice_xfer_report *rep)
{
	char url[1200];
	ssize_t rc;

	sl__err_clear();
	if ((rc = sl_object_url(url, sizeof(url), bucket, key)))
		return rc;
	return sl__write_whole(c->eng, c->s3, url, src, len, rep);
}

int sluice_s3_size(struct sluice_s3 *c, const char *bucket, const char *key, uint64_t *size)
{
	struct sluice_file *f;
	int rc = sl_object_open(c, bucket, key, &f);

	if (rc)
		return rc;
	*size = sluice_file_size(f);
	sluice_file_close(f);
	return 0;
}

/* One async call's arguments, copied: the caller's strings may go once the call returns. */
struct sl_call {
	struct sluice_s3 *c;
	char *bucket, *key;
	void *buf;
	uint64_t offset;
	size_t len;
	int write;
};

static void sl_call_free(void *p)
{
	struct sl_call *a = p;

	free(a->bucket);
	free(a->key);
	free(a);
}

static ssize_t sl_call_run(void *p, struct sluice_xfer_report *rep)
{
	struct sl_call *a = p;

	return a->write ? sluice_s3_write_from_gpu(a->c, a->bucket, a->key, a->buf, a->len, rep)
			: sluice_s3_read_to_gpu(a->c, a->bucket, a->key, a->buf, a->offset, a->len, rep);
}

static int sl_async(struct sluice_s3 *c, const char *bucket, const char *key, void *buf, uint64_t offset, size_t len,
		    int write, void (*cb)(ssize_t, void *), void *user, struct sluice_future **out)
{
	struct sl_call *a = calloc(1, sizeof(*a));

	sl__err_clear();
	*out = NULL;
	if (!bucket || !key)
		return sl__err(SLUICE_EINVAL_CONFIG, "an async object transfer needs a bucket and a key");
	if (!a || !(a->bucket = strdup(bucket)) || !(a->key = strdup(key))) {
		if (a)
			sl_call_free(a);
		return -ENOMEM;
	}
	a->c = c, a->buf = buf, a->offset = offset, a->len = len, a->write = write;
	return sl__future_call(out, sl_call_run, a, sl_call_free, cb, user);
}

int sluice_s3_read_async(struct sluice_s3 *c, const char *bucket, const char *key, void *dst, uint64_t offset,
			 size_t len, void (*cb)(ssize_t result, void *user), void *user, struct sluice_future **out)
{
	return sl_async(c, bucket, key, dst, offset, len, 0, cb, user, out);
}

int sluice_s3_write_async(struct sluice_s3 *c, const char *bucket, const char *key, const void *src, size_t len,
			  void (*cb)(ssize_t result, void *user), void *user, struct sluice_future **out)
{
	return sl_async(c, bucket, key, (void *)src, 0, len, 1, cb, user, out);
}
