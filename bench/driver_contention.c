/*
 * bench/driver_contention.py's load: background threads that each load the
 * machine one way: the CPU (a spin over a private 256 KiB buffer), memory
 * bandwidth (memcpy of 64 MiB), or the CUDA driver (cheap calls on a stream
 * of their own: a 4 KiB device copy, an event recorded and queried), in the
 * caller's context or in a context of their own.  The script builds it with
 * gcc; CUDA is loaded at run time.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { LOAD_CPU, LOAD_MEMCPY, LOAD_CUDA, LOAD_CUDA_OWN_CONTEXT };

typedef int (*cu_fn)();
static cu_fn ctx_get, ctx_set, ctx_create, stream_create, event_create, event_record, event_query, mem_alloc,
	copy_dtod;
static void *ctx, *own_ctx;
static atomic_int stopping;
static atomic_long ops;
static int kind, nthreads;
static pthread_t threads[64];

static void *load(void *arg)
{
	(void)arg;
	if (kind >= LOAD_CUDA) {
		void *s, *e;
		unsigned long long a, b;

		ctx_set(kind == LOAD_CUDA_OWN_CONTEXT ? own_ctx : ctx);
		if (stream_create(&s, 1) || event_create(&e, 2) || mem_alloc(&a, 4096) || mem_alloc(&b, 4096))
			return NULL;
		while (!stopping) {
			copy_dtod(a, b, 4096, s);
			event_record(e, s);
			event_query(e);
			atomic_fetch_add(&ops, 3);
		}
		return NULL;
	}
	size_t n = kind == LOAD_MEMCPY ? 64u << 20 : 256u << 10;
	char *x = malloc(n), *y = malloc(n);

	if (!x || !y)
		return NULL;
	memset(x, 1, n);
	while (!stopping) {
		memcpy(y, x, n);
		x[0]++;
		atomic_fetch_add(&ops, 1);
	}
	free(x);
	free(y);
	return NULL;
}

/* n threads of load k (the caller's CUDA context current); 0, or nonzero when CUDA or a context failed. */
int contention_start(int k, int n)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);

	if (!h || n < 1 || n > 64)
		return -1;
	ctx_get = (cu_fn)dlsym(h, "cuCtxGetCurrent");
	ctx_set = (cu_fn)dlsym(h, "cuCtxSetCurrent");
	ctx_create = (cu_fn)dlsym(h, "cuCtxCreate_v2");
	stream_create = (cu_fn)dlsym(h, "cuStreamCreate");
	event_create = (cu_fn)dlsym(h, "cuEventCreate");
	event_record = (cu_fn)dlsym(h, "cuEventRecord");
	event_query = (cu_fn)dlsym(h, "cuEventQuery");
	mem_alloc = (cu_fn)dlsym(h, "cuMemAlloc_v2");
	copy_dtod = (cu_fn)dlsym(h, "cuMemcpyDtoDAsync_v2");
	if (ctx_get(&ctx) || !ctx)
		return -2;
	if (k == LOAD_CUDA_OWN_CONTEXT && !own_ctx) {
		int rc = ctx_create(&own_ctx, 0, 0);

		ctx_set(ctx);
		if (rc)
			return rc;
	}
	kind = k;
	nthreads = n;
	stopping = 0;
	ops = 0;
	for (int i = 0; i < n; i++)
		pthread_create(&threads[i], NULL, load, NULL);
	return 0;
}

/* Stops the threads; the operations they did. */
long contention_stop(void)
{
	stopping = 1;
	for (int i = 0; i < nthreads; i++)
		pthread_join(threads[i], NULL);
	return ops;
}
