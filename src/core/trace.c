/*
 * Spans of work in the Chrome trace format (chrome://tracing, Perfetto), for
 * SLUICE_TRACE: what each thread did when, and how much of it the thread
 * spent on a CPU (a span whose CPU time is far below its length was waiting
 * or preempted).  Spans are kept in memory and written when the trace closes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "core.h"

struct sl_span {
	const char *name;
	uint64_t t0, t1, cpu, arg;
	int tid;
};

struct sl__trace {
	pthread_mutex_t lock;
	char *path;
	struct sl_span *s;
	size_t n, bytes; /* spans kept, bytes of s */
	uint64_t origin;
};

uint64_t sl__thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int sl__trace_open(struct sl__trace **out, const char *path)
{
	struct sl__trace *t;
	FILE *f;

	*out = NULL;
	if (!path || !*path)
		return 0;
	/* The file is made now, so a bad path is an error at open, not lost at close. */
	if (!(f = fopen(path, "w")))
		return sl__err(-errno, "SLUICE_TRACE=%s: %s", path, strerror(errno));
	fclose(f);
	if (!(t = calloc(1, sizeof(*t))) || !(t->path = strdup(path))) {
		free(t);
		return -ENOMEM;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->origin = sl__now_ns();
	*out = t;
	return 0;
}

void sl__trace_span(struct sl__trace *t, const char *name, uint64_t t0, uint64_t t1, uint64_t cpu, uint64_t arg)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	if ((t->n + 1) * sizeof(*t->s) > t->bytes)
		(void)sl__reserve(&t->s, &t->bytes, t->bytes ? 2 * t->bytes : 4096 * sizeof(*t->s));
	if ((t->n + 1) * sizeof(*t->s) <= t->bytes) /* else (no memory) the span is left out */
		t->s[t->n++] = (struct sl_span){ name, t0, t1, cpu, arg, (int)syscall(SYS_gettid) };
	pthread_mutex_unlock(&t->lock);
}

int sl__trace_close(struct sl__trace *t)
{
	FILE *f;
	int rc = 0;

	if (!t)
		return 0;
	if (!(f = fopen(t->path, "w"))) {
		rc = sl__err(-errno, "SLUICE_TRACE=%s: %s", t->path, strerror(errno));
	} else {
		fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
		for (size_t i = 0; i < t->n; i++) {
			const struct sl_span *s = &t->s[i];

			fprintf(f, "%s\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
				   "\"args\":{\"n\":%llu,\"cpu_us\":%.3f}}",
				i ? "," : "", s->name, s->tid, (double)(s->t0 - t->origin) / 1e3, (double)(s->t1 - s->t0) / 1e3,
				(unsigned long long)s->arg, (double)s->cpu / 1e3);
		}
		fprintf(f, "\n]}\n");
		if (fclose(f))
			rc = sl__err(-EIO, "SLUICE_TRACE=%s: write failed", t->path);
	}
	pthread_mutex_destroy(&t->lock);
	free(t->s);
	free(t->path);
	free(t);
	return rc;
}
