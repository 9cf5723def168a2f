/*
 * Prometheus metrics (sluice.h): this process's engine counters and its
 * loaders' figures in the text exposition format 0.0.4, served over HTTP
 * by libmicrohttpd.  Names follow Prometheus's conventions: the unit in the
 * name (_bytes, _seconds), _total on counters, base units.
 */
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag/diag.h"

static struct {
	_Atomic uint64_t bytes[2], calls[2], errors[2], ns[2], segments[2];
	struct sl__hist seg; /* segment latency, ns */
} sl_m;

static pthread_mutex_t sl_srv_mu = PTHREAD_MUTEX_INITIALIZER;
static struct MHD_Daemon *sl_srv;
static unsigned sl_srv_port;

void sl__metrics_call(int write, uint64_t bytes, uint64_t ios, int err, uint64_t ns)
{
	write = !!write;
	atomic_fetch_add_explicit(&sl_m.calls[write], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&sl_m.bytes[write], bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&sl_m.segments[write], ios, memory_order_relaxed);
	atomic_fetch_add_explicit(&sl_m.ns[write], ns, memory_order_relaxed);
	if (err)
		atomic_fetch_add_explicit(&sl_m.errors[write], 1, memory_order_relaxed);
}

void sl__metrics_segment(uint64_t ns)
{
	sl__hist_add(&sl_m.seg, ns);
}

struct sl_out {
	char *buf;
	size_t cap, len;
};

static void SL_PRINTF(2, 3) sl_put(struct sl_out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(o->buf && o->len < o->cap ? o->buf + o->len : NULL, o->buf && o->len < o->cap ? o->cap - o->len : 0,
		      fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

static void sl_head(struct sl_out *o, const char *name, const char *type, const char *help)
{
	sl_put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \\, " and newline escaped, as the format wants. */
static void sl_label(struct sl_out *o, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			sl_put(o, "\\%c", *v);
		else if (*v == '\n')
			sl_put(o, "\\n");
		else
			sl_put(o, "%c", *v);
	}
}

/* The loaders' families, one pass each over the registry. */
struct sl_fam {
	struct sl_out *o;
	const char *name;
	int kind; /* which figure */
};

static int sl_loader_line(const struct sluice_loader_figures *f, void *arg)
{
	static const char *const stage[] = { "read", "decompress", "storage_wait", "collate", "h2d", "consumer_wait" };
	const struct sl_fam *fam = arg;
	const double secs[] = { f->read_s, f->decompress_s, f->storage_wait_s, f->collate_s, f->h2d_s, f->consumer_wait_s };
	const uint64_t counts[] = { f->batches, f->records, f->bytes, f->read_bytes };
	unsigned n = fam->kind == 4 ? 6 : 1;

	for (unsigned i = 0; i < n; i++) {
		sl_put(fam->o, "%s{loader=\"%d.%u\",dataset=\"", fam->name, f->pid, f->id);
		sl_label(fam->o, f->dataset);
		if (fam->kind == 4)
			sl_put(fam->o, "\",stage=\"%s\"} %.6f\n", stage[i], secs[i]);
		else if (fam->kind == 5)
			sl_put(fam->o, "\"} %.6f\n", f->gpu_wait_share);
		else
			sl_put(fam->o, "\"} %llu\n", (unsigned long long)counts[fam->kind]);
	}
	return 0;
}

size_t sluice_metrics_text(char *buf, size_t cap)
{
	static const char *const op[] = { "read", "write" };
	static const struct {
		const char *name, *type, *help;
	} lf[] = {
		{ "sluice_loader_batches_total", "counter", "Batches a loader delivered." },
		{ "sluice_loader_records_total", "counter", "Records a loader delivered." },
		{ "sluice_loader_bytes_total", "counter", "Record bytes a loader delivered." },
		{ "sluice_loader_read_bytes_total", "counter", "Bytes a loader read from storage." },
		{ "sluice_loader_stage_seconds_total", "counter",
		  "Seconds a loader's threads spent in each stage (consumer_wait: the consumer, the GPU, waiting)." },
		{ "sluice_loader_gpu_wait_ratio", "gauge", "Share of the consumer's wall time spent waiting for batches." },
	};
	struct sl_out o = { buf, cap, 0 };

	sl_head(&o, "sluice_info", "gauge", "The sluice library serving these metrics.");
	sl_put(&o, "sluice_info{version=\"%s\"} 1\n", sluice_version());
	sl_head(&o, "sluice_io_bytes_total", "counter", "Bytes the engine's calls moved between storage and memory.");
	for (int w = 0; w < 2; w++)
		sl_put(&o, "sluice_io_bytes_total{op=\"%s\"} %llu\n", op[w], (unsigned long long)atomic_load(&sl_m.bytes[w]));
	sl_head(&o, "sluice_io_calls_total", "counter", "Engine calls finished (a read or write of one or more ranges).");
	for (int w = 0; w < 2; w++)
		sl_put(&o, "sluice_io_calls_total{op=\"%s\"} %llu\n", op[w], (unsigned long long)atomic_load(&sl_m.calls[w]));
	sl_head(&o, "sluice_io_errors_total", "counter", "Engine calls that failed.");
	for (int w = 0; w < 2; w++)
		sl_put(&o, "sluice_io_errors_total{op=\"%s\"} %llu\n", op[w], (unsigned long long)atomic_load(&sl_m.errors[w]));
	sl_head(&o, "sluice_io_segments_total", "counter", "Storage I/Os (segments) the engine's calls were split into.");
	for (int w = 0; w < 2; w++)
		sl_put(&o, "sluice_io_segments_total{op=\"%s\"} %llu\n", op[w],
		       (unsigned long long)atomic_load(&sl_m.segments[w]));
	sl_head(&o, "sluice_io_call_seconds_total", "counter", "Wall seconds of the engine's calls, summed.");
	for (int w = 0; w < 2; w++)
		sl_put(&o, "sluice_io_call_seconds_total{op=\"%s\"} %.6f\n", op[w], (double)atomic_load(&sl_m.ns[w]) / 1e9);
	sl_head(&o, "sluice_io_segment_seconds", "summary", "Latency of one segment: storage I/O through its copy.");
	for (int q = 0; q < 3; q++) {
		static const double qs[] = { 0.5, 0.9, 0.99 };

		sl_put(&o, "sluice_io_segment_seconds{quantile=\"%g\"} %.9f\n", qs[q],
		       atomic_load(&sl_m.seg.n) ? (double)sl__hist_percentile(&sl_m.seg, qs[q] * 100) / 1e9 : 0.0);
	}
	sl_put(&o, "sluice_io_segment_seconds_sum %.9f\nsluice_io_segment_seconds_count %llu\n",
	       (double)atomic_load(&sl_m.seg.sum) / 1e9, (unsigned long long)atomic_load(&sl_m.seg.n));
	for (int k = 0; k < 6; k++) {
		struct sl_fam fam = { &o, lf[k].name, k };

		sl_head(&o, lf[k].name, lf[k].type, lf[k].help);
		sl__pub_each(sl_loader_line, &fam);
	}
	if (buf && cap)
		buf[o.len < cap ? o.len : cap - 1] = 0;
	return o.len;
}

static enum MHD_Result sl_answer(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				 const char *version, const char *upload, size_t *upload_len, void **state)
{
	struct MHD_Response *r;
	enum MHD_Result ret;
	unsigned status = MHD_HTTP_OK;
	size_t n;
	char *text;

	(void)cls, (void)version, (void)upload, (void)upload_len, (void)state;
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		static char no[] = "only GET\n";

		r = MHD_create_response_from_buffer(sizeof(no) - 1, no, MHD_RESPMEM_PERSISTENT);
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics") && strcmp(url, "/")) {
		static char nf[] = "sluice serves /metrics\n";

		r = MHD_create_response_from_buffer(sizeof(nf) - 1, nf, MHD_RESPMEM_PERSISTENT);
		status = MHD_HTTP_NOT_FOUND;
	} else {
		/* Rendered twice at most: the loaders may grow between the sizing and the writing. */
		n = sluice_metrics_text(NULL, 0) + 4096;
		text = malloc(n);
		if (!text)
			return MHD_NO;
		sluice_metrics_text(text, n); /* cut to n if the loaders grew meanwhile: NUL-terminated either way */
		r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
		if (r)
			MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
		else
			free(text);
	}
	if (!r)
		return MHD_NO;
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

int sluice_metrics_serve(unsigned port, unsigned *bound)
{
	int rc = 0;

	if (port > 65535)
		return sl__err(SLUICE_EINVAL_CONFIG, "metrics port %u is outside 0..65535", port);
	pthread_mutex_lock(&sl_srv_mu);
	if (!sl_srv) {
		const union MHD_DaemonInfo *di;

		errno = 0;
		sl_srv = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, (uint16_t)port, NULL, NULL,
					  sl_answer, NULL, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
		if (!sl_srv) {
			int e = errno ? errno : EADDRINUSE;

			rc = sl__err(-e, "metrics on port %u: cannot listen (%s); give each process its own port, as "
				     "SLUICE_METRICS_PORT=$((9400 + LOCAL_RANK))", port, strerror(e));
		} else if ((di = MHD_get_daemon_info(sl_srv, MHD_DAEMON_INFO_BIND_PORT))) {
			sl_srv_port = di->port;
		} else {
			sl_srv_port = port;
		}
		if (!rc)
			sl__info("diag", "metrics on http://0.0.0.0:%u/metrics", sl_srv_port);
	}
	if (!rc && bound)
		*bound = sl_srv_port;
	pthread_mutex_unlock(&sl_srv_mu);
	return rc;
}

int sl__metrics_auto(void)
{
	uint64_t p;
	int rc = sl__setting_u64("SLUICE_METRICS_PORT", &p);

	return rc ? (rc > 0 ? 0 : rc) : sluice_metrics_serve((unsigned)p, NULL);
}
