/*
 * GPU transfers: file <-> device memory through every path (pinned
 * bounce, pageable baseline, O_DIRECT and page cache, forced cuFile),
 * odd sizes, offsets and device addresses, scattered batches, durable
 * writes from device memory, and stream-ordered async calls.
 * Skips (77) where no CUDA GPU is present.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "xfer/xfer.h"
#include "t_util.h"

static const char *dir;
static uint64_t rng = 777;

static uint64_t rnd(uint64_t n)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (rng >> 11) % n;
}

static struct sluice_engine *engine(enum sluice_direct d, enum sluice_staging s, enum sluice_backend b,
				    int *rc_out)
{
	struct sluice_config *cfg;
	struct sluice_engine *eng = NULL;
	int rc;

	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(sluice_config_set_direct(cfg, d) == 0);
	T_CHECK(sluice_config_set_staging(cfg, s) == 0);
	T_CHECK(sluice_config_set_backend(cfg, b) == 0);
	T_CHECK(sluice_config_set_max_transfer_size(cfg, 1u << 20) == 0);
	rc = sluice_engine_open(&eng, cfg);
	sluice_config_free(cfg);
	if (rc_out)
		*rc_out = rc;
	else
		T_CHECK(rc == 0);
	return eng;
}

/* Device memory back to the host, then compare. */
static int dev_equals(struct sluice_engine *eng, const void *dptr, const void *want, size_t n)
{
	char *h = malloc(n);
	int ok = h && sluice_gpu_copy(eng, h, dptr, n) == 0 && !memcmp(h, want, n);

	free(h);
	return ok;
}

static void poison(struct sluice_engine *eng, void *dptr, size_t n)
{
	char *h = malloc(n);

	memset(h, 0xA5, n);
	T_CHECK(sluice_gpu_copy(eng, dptr, h, n) == 0);
	free(h);
}

static void t_reads(struct sluice_engine *eng, const char *path, const char *want, size_t n,
		    const char *expect_path)
{
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct sluice_file *f;
	char *d;

	T_CHECK(sluice_gpu_alloc(eng, n + 4096, (void **)&d) == 0);
	T_CHECK(sluice_is_gpu_ptr(eng, d) && !sluice_is_gpu_ptr(eng, want));
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	poison(eng, d, n);
	T_CHECK(sluice_file_read(f, 0, n, d, &rep) == (ssize_t)n);
	T_CHECK(dev_equals(eng, d, want, n));
	T_CHECK(strstr(rep.path, expect_path) != NULL);
	if (!strstr(rep.path, expect_path))
		fprintf(stderr, "path %s, expected %s\n", rep.path, expect_path);
	for (int i = 0; i < 40; i++) {
		uint64_t off = rnd(n);
		size_t len = (size_t)rnd(n - off) % (5u << 20) + 1, mis = (size_t)rnd(4000);

		poison(eng, d + mis, len);
		T_CHECK(sluice_file_read(f, off, len, d + mis, NULL) == (ssize_t)len);
		T_CHECK(dev_equals(eng, d + mis, want + off, len));
	}
	/* Scattered batch with neighbours and gaps, into GPU memory. */
	{
		struct sluice_range r[100];

		for (int i = 0; i < 100; i++)
			r[i] = (struct sluice_range){ f, (uint64_t)i * 9000 + (i % 3) * 100, 8000, d + i * 8000 };
		T_CHECK(sluice_read_batch(eng, r, 100, &rep) == 800000);
		for (int i = 0; i < 100; i++)
			T_CHECK(dev_equals(eng, r[i].buf, want + r[i].offset, 8000));
	}
	T_CHECK(sluice_file_read(f, n, 1, d, NULL) == SLUICE_ERANGE);
	sluice_file_close(f);
	sluice_gpu_free(eng, d);
}

/* One read of [off, off+len) into d+mis: its bytes, and whether its path says it took p. */
static int t_read_path(struct sluice_file *f, char *d, size_t mis, uint64_t off, size_t len, const char *want,
		       const char *p)
{
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;

	poison(f->eng, d + mis, len);
	T_CHECK(sluice_file_read(f, off, len, d + mis, &rep) == (ssize_t)len);
	T_CHECK(dev_equals(f->eng, d + mis, want + off, len));
	printf("  %zu bytes at %llu: %s\n", len, (unsigned long long)off, rep.path);
	return strstr(rep.path, p) != NULL;
}

/*
 * With SLUICE_PAGECACHE_DMA_MIN/MAX at 1M/4M, reads of cached bytes of 1-4
 * MiB go by DMA from the page cache itself, odd offsets and addresses too;
 * larger and smaller ones through the bounce slots, and none with the
 * defaults (off).
 */
static void t_pagecache_dma(const char *path, const char *want, size_t n)
{
	struct sluice_engine *eng;
	struct sluice_file *f;
	char *d, *tmp = malloc(n);
	int fd = open(path, O_RDONLY);

	setenv("SLUICE_PAGECACHE_DMA_MIN", "1M", 1);
	setenv("SLUICE_PAGECACHE_DMA_MAX", "4M", 1);
	eng = engine(SLUICE_DIRECT_AUTO, SLUICE_STAGING_PINNED, SLUICE_BACKEND_AUTO, NULL);
	unsetenv("SLUICE_PAGECACHE_DMA_MIN");
	unsetenv("SLUICE_PAGECACHE_DMA_MAX");

	T_CHECK(tmp && fd >= 0 && read(fd, tmp, n) == (ssize_t)n); /* in the page cache */
	close(fd);
	free(tmp);
	T_CHECK(sluice_gpu_alloc(eng, 8u << 20, (void **)&d) == 0);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	T_CHECK(t_read_path(f, d, 0, 0, 2u << 20, want, ":pagecache>gpu"));
	T_CHECK(t_read_path(f, d, 77, 12345, 3u << 20, want, ":pagecache>gpu"));
	T_CHECK(t_read_path(f, d, 4096, n - (1u << 20) - 5, (1u << 20) + 5, want, ":pagecache>gpu")); /* to the end */
	T_CHECK(!t_read_path(f, d, 0, 4096, 7u << 20, want, "pagecache"));
	T_CHECK(!t_read_path(f, d, 0, 4096, 256u << 10, want, "pagecache"));
	for (int i = 0; i < 20; i++) { /* their pages overlap now and then: those copy through the slots */
		uint64_t off = rnd(n - (4u << 20));

		t_read_path(f, d, (size_t)rnd(4000), off, (size_t)(1u << 20) + (size_t)rnd(3u << 20), want, "");
	}
	sluice_file_close(f);
	sluice_gpu_free(eng, d);
	sluice_engine_close(eng);

	eng = engine(SLUICE_DIRECT_AUTO, SLUICE_STAGING_PINNED, SLUICE_BACKEND_AUTO, NULL);
	T_CHECK(sluice_gpu_alloc(eng, 8u << 20, (void **)&d) == 0);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	T_CHECK(!t_read_path(f, d, 0, 0, 2u << 20, want, "pagecache"));
	sluice_file_close(f);
	sluice_gpu_free(eng, d);
	sluice_engine_close(eng);
}

static void t_writes(struct sluice_engine *eng, const char *src_host, size_t n)
{
	char path[600], *d, *back;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct sluice_file *f;
	size_t got;

	snprintf(path, sizeof(path), "%s/from_gpu.bin", dir);
	T_CHECK(sluice_gpu_alloc(eng, n, (void **)&d) == 0);
	T_CHECK(sluice_gpu_copy(eng, d, src_host, n) == 0);
	T_CHECK(sluice_write_from_gpu(eng, path, d, n, &rep) == (ssize_t)n);
	T_CHECK(strstr(rep.path, "gpu>") != NULL);
	back = t_slurp(path, &got);
	T_CHECK(back && got == n && !memcmp(back, src_host, n));
	free(back);
	/* Odd offsets from odd device addresses. */
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDWR) == 0);
	for (int i = 0; i < 20; i++) {
		uint64_t off = rnd(n / 2);
		size_t len = (size_t)rnd(n / 2) + 1, mis = (size_t)rnd(100);

		T_CHECK(sluice_file_write(f, off, len, d + mis, NULL) == (ssize_t)len);
		back = t_slurp(path, &got);
		T_CHECK(back && got == n && !memcmp(back + off, src_host + mis, len));
		free(back);
	}
	sluice_file_close(f);
	sluice_gpu_free(eng, d);
}

static void t_async(struct sluice_engine *eng, const char *path, const char *want, size_t n)
{
	const struct sl__cuda_api *cu = sl__cuda(NULL);
	struct sluice_future *fut;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct sluice_file *f;
	sl_CUstream s;
	char *d, *h = malloc(n), wpath[600], *back;
	size_t got;

	T_CHECK(sluice_gpu_alloc(eng, n, (void **)&d) == 0);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	T_CHECK(cu->StreamCreate(&s, SL_CU_STREAM_NON_BLOCKING) == 0);
	/* Several windows (1 MiB transfers), an odd offset and length, the legacy stream. */
	for (int round = 0; round < 3; round++) {
		size_t off = round == 1 ? 4099 : 0, len = n - off - (round == 1 ? 3 : 0);
		sl_CUstream rs = round == 2 ? NULL : s;

		poison(eng, d, n);
		memset(h, 0, n);
		/* The stream's next copy must see the bytes: the async read holds it. */
		T_CHECK(sluice_read_async(f, off, len, d, rs, &fut) == 0);
		T_CHECK(cu->MemcpyDtoHAsync(h, (sl_CUdeviceptr)(uintptr_t)d, len, rs) == 0);
		T_CHECK(cu->StreamSynchronize(rs) == 0);
		T_CHECK(!memcmp(h, want + off, len));
		T_CHECK(sluice_future_wait(fut, &rep) == (ssize_t)len && rep.bytes == len);
		T_CHECK(strstr(rep.path, ">pinned>gpu") != NULL);
		sluice_future_free(fut);
	}
	T_CHECK(sluice_read_async(f, 1, n, d, s, &fut) == SLUICE_ERANGE && !fut);
	T_CHECK(sluice_read_async(f, 0, n, h, s, &fut) == SLUICE_ENOTGPU && !fut);
	/* Async write of device memory, ordered after the stream's earlier work. */
	snprintf(wpath, sizeof(wpath), "%s/async_w.bin", dir);
	{
		struct sluice_file *w;

		T_CHECK(sluice_file_open(&w, eng, wpath, SLUICE_RDWR | SLUICE_CREATE) == 0);
		T_CHECK(sluice_write_async(w, 0, n - 5, d, s, &fut) == 0);
		T_CHECK(sluice_future_wait(fut, NULL) == (ssize_t)(n - 5));
		sluice_future_free(fut);
		back = t_slurp(wpath, &got);
		T_CHECK(back && got == n - 5 && !memcmp(back, want, n - 5));
		free(back);
		sluice_file_close(w);
	}
	T_CHECK(cu->StreamSynchronize(s) == 0);
	cu->StreamDestroy(s);
	sluice_file_close(f);
	sluice_gpu_free(eng, d);
	free(h);
}

/* Dataset records straight into GPU memory, CRCs checked by the workers. */
static void t_dataset_batch(struct sluice_engine *eng)
{
	static const struct sluice_field f[1] = { { "blob", SLUICE_DTYPE_BYTES, 0, { 0 } } };
	struct sluice_writer *w;
	struct sluice_dataset *ds;
	char path[700], blob[5000], *d, *h = malloc(1 << 20), *one = malloc(8192);
	uint64_t idx[100], off[101];

	snprintf(path, sizeof(path), "%s/ds", dir);
	T_CHECK(sluice_writer_open(&w, path, f, 1, NULL) == 0);
	for (int i = 0; i < 100; i++) {
		size_t l = 100 + (size_t)i * 37;
		const void *v[1] = { blob };

		t_fill(blob, l, (uint64_t)i);
		T_CHECK(sluice_writer_add(w, v, &l) == 0);
		idx[i] = (uint64_t)(i * 7 % 100);
	}
	T_CHECK(sluice_writer_close(w) == 0);
	T_CHECK(sluice_dataset_open(&ds, path) == 0);
	T_CHECK(sluice_gpu_alloc(eng, 1 << 20, (void **)&d) == 0);
	T_CHECK(sluice_dataset_read_batch(eng, ds, idx, 100, d, 1 << 20, off, NULL) > 0);
	T_CHECK(sluice_gpu_copy(eng, h, d, off[100]) == 0);
	for (int k = 0; k < 100; k++) {
		ssize_t l = sluice_dataset_read(ds, idx[k], one, 8192, NULL);

		T_CHECK(l > 0 && !memcmp(h + off[k], one, (size_t)l));
	}
	sluice_gpu_free(eng, d);

	/* The loader into GPU memory: every batch's bytes equal the records it names. */
	struct sluice_loader_options lo = { .size = sizeof(struct sluice_loader_options), .batch_size = 10, .gpu = 1, .seed = 3, .shuffle = 1, .prefetch = 2 };
	struct sluice_loader *ld;
	struct sluice_batch b = SLUICE_BATCH_INIT;
	const struct sl__cuda_api *cu = sl__cuda(NULL);
	sl_CUstream s;
	int rc = -1, nb = 0;

	T_CHECK(cu->StreamCreate(&s, SL_CU_STREAM_NON_BLOCKING) == 0);
	T_CHECK(sluice_loader_open(&ld, eng, ds, &lo) == 0);
	while (ld && (rc = sluice_loader_next(ld, &b, s)) == 1) {
		uint64_t offs[11];

		T_CHECK(b.event && cu->EventSynchronize((sl_CUevent)b.event) == 0);
		T_CHECK(sluice_gpu_copy(eng, offs, b.field[0].offsets, sizeof(offs)) == 0);
		T_CHECK(sluice_gpu_copy(eng, h, b.field[0].data, offs[10]) == 0);
		for (uint32_t k = 0; k < b.size; k++) {
			struct sluice_record rec;

			T_CHECK(sluice_dataset_read(ds, b.ids[k], one, 8192, &rec) > 0 &&
				offs[k + 1] - offs[k] == rec.len[0] && !memcmp(h + offs[k], rec.data[0], rec.len[0]));
		}
		nb++;
	}
	T_CHECK(nb == 10 && rc == 0);
	sluice_loader_close(ld);
	cu->StreamDestroy(s);
	sluice_dataset_close(ds);
	free(h);
	free(one);
}

int main(void)
{
	const size_t n = (24u << 20) + 4099;
	char path[600], *want;
	struct sluice_engine *eng;
	struct sluice_engine_info info = SLUICE_ENGINE_INFO_INIT;
	void *p;
	int rc;

	if (sluice_gpu_count() == 0) {
		printf("SKIP: no CUDA GPU (%s)\n", sl__cuda(NULL) ? "driver present, no device" : "no driver");
		return T_SKIP;
	}
	dir = t_dir("t_gpu");
	snprintf(path, sizeof(path), "%s/src.bin", dir);
	want = t_make_file(path, n, 11);

	eng = engine(SLUICE_DIRECT_AUTO, SLUICE_STAGING_PINNED, SLUICE_BACKEND_AUTO, NULL);
	T_CHECK(sluice_engine_get_info(eng, &info) == 0);
	printf("GPU %d %s, backend %s, pool pinned %d, fixed buffers %d\nunusable: %s\n", info.gpu,
	       info.gpu_name, info.backend, info.pool_pinned, info.uring_fixed_buffers, info.unusable);
	T_CHECK(info.gpu >= 0 && info.pool_pinned);
	t_reads(eng, path, want, n, ">pinned>gpu");
	printf("reads ok so far (%d failures)\n", t_failures);
	fflush(stdout);
	t_writes(eng, want, n);
	printf("writes done (%d failures)\n", t_failures);
	fflush(stdout);
	t_async(eng, path, want, n);
	printf("async done (%d failures)\n", t_failures);
	t_dataset_batch(eng);
	printf("dataset batch and loader to GPU done (%d failures)\n", t_failures);
	t_pagecache_dma(path, want, n);
	printf("page-cache DMA done (%d failures)\n", t_failures);
	fflush(stdout);
	rc = sluice_gpu_alloc(eng, (size_t)1 << 50, &p);
	T_CHECK(rc == SLUICE_ECUDA && strstr(sluice_last_error_detail(), "out of memory"));
	sluice_engine_close(eng);

	eng = engine(SLUICE_DIRECT_ALWAYS, SLUICE_STAGING_PINNED, SLUICE_BACKEND_PSYNC, NULL);
	t_reads(eng, path, want, n, "psync:direct>pinned>gpu");
	sluice_engine_close(eng);
	printf("psync direct done (%d failures)\n", t_failures);
	fflush(stdout);
	eng = engine(SLUICE_DIRECT_NEVER, SLUICE_STAGING_PAGEABLE, SLUICE_BACKEND_AUTO, NULL);
	t_reads(eng, path, want, n, "buffered>pageable>gpu");
	t_writes(eng, want, n);
	sluice_engine_close(eng);

	/* cuFile, forced (compat mode allowed when forced). */
	eng = engine(SLUICE_DIRECT_AUTO, SLUICE_STAGING_PINNED, SLUICE_BACKEND_GDS, &rc);
	if (rc == SLUICE_EBACKEND) {
		printf("gds backend: SKIPPED (%s)\n", sluice_last_error_detail());
	} else {
		T_CHECK(rc == 0);
		if (!rc) {
			T_CHECK(sluice_engine_get_info(eng, &info) == 0);
			struct sluice_file *f;
			int registered;

			/* Where cuFile refuses the file's filesystem, the engine says so and bounces. */
			T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
			registered = f && sl__gds_registered(&f->s);
			sluice_file_close(f);
			printf("gds backend: real GDS %d, %s registered with cuFile\n", info.gds, registered ? "file" : "file NOT");
			{
				/* The caller's memory registered with the stores that take it (cuFileBufRegister), and undone. */
				void *m = NULL;

				T_CHECK(sluice_gpu_alloc(eng, 1 << 20, &m) == 0); /* registered by the alloc */
				sluice_gpu_deregister(eng, m);
				rc = sluice_gpu_register(eng, m, 1 << 20);
				printf("gds backend: cuFileBufRegister of 1 MiB: %s\n", rc ? sluice_last_error_detail() : "ok");
				T_CHECK(rc == 0);
				sluice_gpu_free(eng, m);
			}
			t_reads(eng, path, want, n, registered ? "gds>gpu" : ">pinned>gpu");
			t_writes(eng, want, n);
			sluice_engine_close(eng);
		}
	}
	free(want);
	return t_done("t_gpu");
}
