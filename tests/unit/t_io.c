/*
 * Backend round trips, run once per backend (SLUICE_BACKEND=psync|uring):
 * random data, odd sizes and offsets, every direct policy, coalesced
 * batches, EOF, a shrinking file, O_DIRECT refused, and error paths.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "t_util.h"
#include "xfer/xfer.h"

static const char *dir;
static uint64_t rng = 12345;

static uint64_t rnd(uint64_t n)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (rng >> 11) % n;
}

static struct sluice_engine *open_engine(enum sluice_direct d, size_t chunk)
{
	struct sluice_config *cfg;
	struct sluice_engine *eng;
	int rc;

	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(sluice_config_set_direct(cfg, d) == 0);
	T_CHECK(sluice_config_set_max_transfer_size(cfg, chunk) == 0);
	T_CHECK(sluice_config_set_threads(cfg, 3) == 0);
	rc = sluice_engine_open(&eng, cfg);
	sluice_config_free(cfg);
	if (rc == SLUICE_EBACKEND) {
		printf("SKIP: %s\n", sluice_last_error_detail());
		exit(T_SKIP);
	}
	T_CHECK(rc == 0);
	if (rc)
		exit(1);
	return eng;
}

static void t_reads(enum sluice_direct d, size_t chunk)
{
	const size_t n = (10u << 20) + 1234;
	char path[600], *want, *got = malloc(n + 8192);
	struct sluice_engine *eng = open_engine(d, chunk);
	struct sluice_engine_info info = SLUICE_ENGINE_INFO_INIT;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct sluice_file *f;
	const char *be = getenv("SLUICE_BACKEND");

	snprintf(path, sizeof(path), "%s/r.bin", dir);
	want = t_make_file(path, n, 7);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	T_CHECK(sluice_file_size(f) == n);

	/* Whole file, first thing after open: workers still pinning their slots leave it to the others. */
	memset(got, 0xAA, n);
	T_CHECK(sluice_file_read(f, 0, n, got, &rep) == (ssize_t)n);
	T_CHECK(!memcmp(got, want, n));
	/* Once every worker is prepared: as root, nothing refuses io_uring's fixed buffers. */
	T_CHECK(sluice_engine_get_info(eng, &info) == 0);
	T_CHECK(!be || !strcmp(info.backend, be));
	if (!strcmp(info.backend, "uring") && geteuid() == 0)
		T_CHECK(info.uring_fixed_buffers == 1);
	T_CHECK(rep.bytes == n && rep.bytes_direct + rep.bytes_buffered == n);
	T_CHECK(!strncmp(rep.path, info.backend, strlen(info.backend)));
	if (d == SLUICE_DIRECT_ALWAYS)
		T_CHECK(rep.bytes_direct == n && strstr(rep.path, "direct"));
	if (d == SLUICE_DIRECT_NEVER)
		T_CHECK(rep.bytes_buffered == n && !strstr(rep.path, "direct"));

	/* Odd offsets and lengths, into odd destination addresses. */
	for (int i = 0; i < 200; i++) {
		uint64_t off = rnd(n);
		size_t len = (size_t)rnd(n - off) % (3u << 20) + 1, mis = (size_t)rnd(64);

		memset(got + mis, 0x55, len);
		T_CHECK(sluice_file_read(f, off, len, got + mis, NULL) == (ssize_t)len);
		T_CHECK(!memcmp(got + mis, want + off, len));
	}
	/* The last byte, the exact end, zero bytes and past the end. */
	T_CHECK(sluice_file_read(f, n - 1, 1, got, NULL) == 1 && got[0] == want[n - 1]);
	T_CHECK(sluice_file_read(f, 0, 0, got, NULL) == 0);
	T_CHECK(sluice_file_read(f, n - 10, 11, got, NULL) == SLUICE_ERANGE);
	T_CHECK(strstr(sluice_last_error_detail(), "r.bin") != NULL);
	T_CHECK(sluice_file_read(f, n + 4096, 1, got, NULL) == SLUICE_ERANGE);
	T_CHECK(sluice_file_read(f, UINT64_MAX - 1, 4, got, NULL) == SLUICE_ERANGE);
	T_CHECK(sluice_file_read(f, 0, 10, NULL, NULL) == -EINVAL);

	/* Batches: 64 neighbours coalesce; random ranges land in place. */
	{
		struct sluice_range r[200];
		char *dst = malloc(200 * 5000);

		for (int i = 0; i < 64; i++)
			r[i] = (struct sluice_range){ f, 4096 + (uint64_t)i * 4096, 4096, dst + i * 4096 };
		T_CHECK(sluice_read_batch(eng, r, 64, &rep) == 64 * 4096);
		T_CHECK(!memcmp(dst, want + 4096, 64 * 4096));
		T_CHECK(rep.ios >= 1 && (chunk == 4096 || rep.ios < 64));
		for (int i = 0; i < 200; i++) {
			size_t len = (size_t)rnd(5000) + 1;

			r[i] = (struct sluice_range){ f, rnd(n - len), len, dst + i * 5000 };
		}
		ssize_t want_bytes = 0;

		for (int i = 0; i < 200; i++)
			want_bytes += (ssize_t)r[i].len;
		T_CHECK(sluice_read_batch(eng, r, 200, NULL) == want_bytes);
		for (int i = 0; i < 200; i++)
			T_CHECK(!memcmp(r[i].buf, want + r[i].offset, r[i].len));
		/*
		 * Ranges 4 bytes apart in the file and in memory: the bytes between
		 * them in memory are the caller's and stay untouched.
		 */
		memset(dst, 0x5a, 1000);
		for (int i = 0; i < 8; i++)
			r[i] = (struct sluice_range){ f, 100 + (uint64_t)i * 104, 100, dst + i * 104 };
		T_CHECK(sluice_read_batch(eng, r, 8, NULL) == 800);
		for (int i = 0; i < 8; i++)
			T_CHECK(!memcmp(dst + i * 104, want + 100 + i * 104, 100) &&
				!memcmp(dst + i * 104 + 100, "\x5a\x5a\x5a\x5a", 4));
		for (int i = 0; i < 200; i++)
			r[i] = (struct sluice_range){ f, rnd(n - 5000), (size_t)rnd(5000) + 1, dst + i * 5000 };
		r[7].offset = n; /* one bad range fails the batch, naming the file */
		T_CHECK(sluice_read_batch(eng, r, 200, NULL) == SLUICE_ERANGE);
		free(dst);
	}

	/* A file that shrinks under a transfer: a clear error, not silent zeros. */
	T_CHECK(truncate(path, (off_t)(n / 2)) == 0);
	T_CHECK(sluice_file_read(f, 0, n, got, NULL) == SLUICE_ESHORT);
	T_CHECK(strstr(sluice_last_error_detail(), "shrank") != NULL);

	sluice_file_close(f);
	sluice_engine_close(eng);
	free(want);
	free(got);
}

static void t_writes(enum sluice_direct d, size_t chunk)
{
	struct sluice_engine *eng = open_engine(d, chunk);
	struct sluice_file *f;
	char path[600], *src = malloc(4u << 20), *back;
	size_t n;

	snprintf(path, sizeof(path), "%s/w.bin", dir);
	unlink(path);
	t_fill(src, 4u << 20, 99);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDWR | SLUICE_CREATE) == 0);
	/* An unaligned tail past the end: direct writes pad, then trim. */
	T_CHECK(sluice_file_write(f, 0, (3u << 20) + 777, src, NULL) == (3u << 20) + 777);
	T_CHECK(sluice_file_sync(f) == 0);
	back = t_slurp(path, &n);
	T_CHECK(back && n == (3u << 20) + 777 && !memcmp(back, src, n));
	free(back);
	T_CHECK(sluice_file_size(f) == (3u << 20) + 777);
	/* Odd offsets inside the file, from odd source addresses. */
	size_t size = (3u << 20) + 777;

	for (int i = 0; i < 50; i++) {
		uint64_t off = rnd(3u << 20);
		size_t len = (size_t)rnd(1u << 20) + 1;

		T_CHECK(sluice_file_write(f, off, len, src + 13 + i, NULL) == (ssize_t)len);
		back = t_slurp(path, &n);
		T_CHECK(back && !memcmp(back + off, src + 13 + i, len));
		if (off + len > size)
			size = off + len;
		T_CHECK(n == size);
		free(back);
	}
	sluice_file_close(f);

	/* A write that ends inside the last block must not cut the file. */
	back = t_make_file(path, 8100, 5);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDWR) == 0);
	T_CHECK(sluice_file_write(f, 0, 8000, src, NULL) == 8000);
	free(back);
	back = t_slurp(path, &n);
	T_CHECK(back && n == 8100 && !memcmp(back, src, 8000));
	free(back);
	/* Neighbouring ranges past the end, in one batch: the file ends after the last of them. */
	for (uint64_t start = 120; start <= 8100; start += 7980) {
		char p2[700];
		struct sluice_file *g;
		struct sluice_range r[3] = { { NULL, start, 12, src }, { NULL, start + 12, 5, src + 12 },
					     { NULL, start + 17, 4000, src + 17 } };

		snprintf(p2, sizeof(p2), "%s/batch.bin", dir);
		free(t_make_file(p2, start, 6));
		T_CHECK(sluice_file_open(&g, eng, p2, SLUICE_RDWR) == 0);
		for (int k = 0; k < 3; k++)
			r[k].file = g;
		for (size_t m = 2; m <= 3; m++) {
			size_t len = m == 2 ? 17 : 4017;

			T_CHECK(sluice_write_batch(eng, r, m, NULL) == (ssize_t)len);
			back = t_slurp(p2, &n);
			T_CHECK(back && n == start + len && !memcmp(back + start, src, len) && sluice_file_size(g) == n);
			free(back);
		}
		sluice_file_close(g);
	}
	/* Writing through a read-only handle is refused. */
	sluice_file_close(f);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	T_CHECK(sluice_file_write(f, 0, 10, src, NULL) == -EBADF);
	sluice_file_close(f);
	sluice_engine_close(eng);
	free(src);
}

static void t_errors(void)
{
	struct sluice_engine *eng = open_engine(SLUICE_DIRECT_AUTO, 1u << 20);
	struct sluice_file *f = (void *)1;
	char path[600];

	snprintf(path, sizeof(path), "%s/missing.bin", dir);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == -ENOENT && f == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), "missing.bin") != NULL);
	T_CHECK(sluice_file_open(&f, eng, dir, SLUICE_RDONLY) == -EISDIR);
	T_CHECK(sluice_read_to_gpu(eng, path, 0, 1, path, NULL) == -ENOENT);
	{
		/* Without a GPU there is no stream to order an async transfer on. */
		struct sluice_engine_info info = SLUICE_ENGINE_INFO_INIT;
		struct sluice_future *fut = (void *)1;
		char buf[16];

		T_CHECK(sluice_engine_get_info(eng, &info) == 0);
		snprintf(path, sizeof(path), "%s/async.bin", dir);
		free(t_make_file(path, sizeof(buf), 3));
		T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
		if (info.gpu < 0)
			T_CHECK(sluice_read_async(f, 0, sizeof(buf), buf, NULL, &fut) == SLUICE_ENOGPU && !fut);
		else
			T_CHECK(sluice_read_async(f, 0, sizeof(buf), buf, NULL, &fut) == SLUICE_ENOTGPU && !fut);
		sluice_file_close(f);
	}
	sluice_file_close(NULL);
	sluice_engine_close(eng);
	sluice_engine_close(NULL);
}

/* A filesystem that refuses O_DIRECT: everything goes through the page cache. */
static void t_direct_refused(void)
{
	struct sluice_engine *eng = open_engine(SLUICE_DIRECT_ALWAYS, 1u << 20);
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct sluice_file *f;
	char path[600], *want, *got = malloc(3u << 20);

	snprintf(path, sizeof(path), "%s/nd.bin", dir);
	want = t_make_file(path, (3u << 20) - 5, 3);
	sl__test_refuse_direct = 1;
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDWR) == 0);
	sl__test_refuse_direct = 0;
	T_CHECK(!sluice_file_direct_ok(f));
	T_CHECK(sluice_file_read(f, 3, (3u << 20) - 8, got, &rep) == (3u << 20) - 8);
	T_CHECK(!memcmp(got, want + 3, (3u << 20) - 8));
	T_CHECK(rep.bytes_direct == 0 && strstr(rep.path, "buffered"));
	T_CHECK(sluice_file_write(f, 1, 5000, want, &rep) == 5000 && rep.bytes_direct == 0);
	sluice_file_close(f);
	sluice_engine_close(eng);
	free(want);
	free(got);
}

/*
 * The registry: each store at the index of its id, its required ops there;
 * paths go to the store of their scheme, and the rest to local files.
 */
static void t_registry(void)
{
	static const char *const url[][2] = { { "s3://b/k", "s3" },	   { "http://h/f", "http" },
					      { "HTTPS://h/f?q", "http" }, { "/tmp/f", NULL },
					      { "s3:/b", NULL },	   { "httpx://h", NULL } };
	struct sluice_engine *eng = open_engine(SLUICE_DIRECT_AUTO, 1u << 20);
	struct sluice_engine_info info = SLUICE_ENGINE_INFO_INIT;

	for (int i = 0; i < SL_STORES; i++) {
		const struct sl__store *st = sl__stores[i];

		if (!st)
			continue;
		T_CHECK(st->id == i && st->name && st->probe && st->open && st->close && st->init && st->submit &&
			st->reap && st->fini);
		T_CHECK(!!(st->caps & SL_STORE_READONLY) == !st->truncate);
	}
	T_CHECK(sluice_engine_get_info(eng, &info) == 0);
	for (size_t i = 0; i < sizeof(url) / sizeof(url[0]); i++) {
		const struct sl__store *st = NULL;

		T_CHECK(sl__store_for(eng, url[i][0], &st) == 0);
		T_CHECK(st && !strcmp(st->name, url[i][1] ? url[i][1] : info.backend));
	}
	sluice_engine_close(eng);
}

/*
 * A report's storage bytes: two 4 KiB ranges a block apart are one I/O through the gap (direct reads: through
 * the page cache no gap is read), so the storage span exceeds the payload; a caller built before bytes_storage existed (size up to bytes_verified) has nothing written
 * past it; a report without its size is refused before any work.
 */
static void t_report_sizes(void)
{
	struct sluice_engine *eng = open_engine(SLUICE_DIRECT_ALWAYS, 1u << 20);
	struct {
		struct sluice_xfer_report rep;
		uint64_t guard;
	} old;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct sluice_file *f;
	char path[600], *want, got[2][4096];
	struct sluice_range r[2];

	snprintf(path, sizeof(path), "%s/gaps.bin", dir);
	want = t_make_file(path, 1 << 20, 9);
	T_CHECK(sluice_file_open(&f, eng, path, SLUICE_RDONLY) == 0);
	r[0] = (struct sluice_range){ f, 8192, 4096, got[0] };
	r[1] = (struct sluice_range){ f, 8192 + 8192, 4096, got[1] };
	T_CHECK(sluice_read_batch(eng, r, 2, &rep) == 8192);
	T_CHECK(!memcmp(got[0], want + 8192, 4096) && !memcmp(got[1], want + 8192 + 8192, 4096));
	if (sluice_file_direct_ok(f))
		T_CHECK(rep.bytes == 8192 && rep.ios == 1 && rep.bytes_storage == 8192 + 4096);
	else
		T_CHECK(rep.bytes == 8192 && rep.ios == 2 && rep.bytes_storage == 8192);
	memset(&old, 0x5a, sizeof(old));
	old.rep.size = offsetof(struct sluice_xfer_report, bytes_verified) + sizeof(uint64_t);
	memset(&old.rep.bytes_storage, 0x5a, sizeof(old.rep.bytes_storage));
	T_CHECK(sluice_read_batch(eng, r, 2, &old.rep) == 8192);
	T_CHECK(old.rep.bytes == 8192 && old.rep.bytes_storage == 0x5a5a5a5a5a5a5a5aull && old.guard == 0x5a5a5a5a5a5a5a5aull);
	rep.size = 0;
	T_CHECK(sluice_read_batch(eng, r, 2, &rep) == SLUICE_EINVAL_CONFIG);
	sluice_file_close(f);
	sluice_engine_close(eng);
	free(want);
}

int main(void)
{
	dir = t_dir("t_io");
	t_registry();
	t_report_sizes();
	for (int d = SLUICE_DIRECT_AUTO; d <= SLUICE_DIRECT_NEVER; d++) {
		t_reads((enum sluice_direct)d, 1u << 20);
		t_writes((enum sluice_direct)d, 64u << 10);
	}
	t_reads(SLUICE_DIRECT_ALWAYS, 4096);
	t_errors();
	t_direct_refused();
	return t_done("t_io");
}
