/*
 * The planner (sl__plan, engine/plan.c) on its own: how ranges become
 * segments (one storage I/O each, at most max_transfer_size) and pieces
 * (the caller memory each feeds).  Scenarios, each a function named for the
 * behaviour it checks; no I/O runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/engine.h"
#include "store/store.h"
#include "t_util.h"

#define CHUNK (256u << 10) /* max_transfer_size here */
#define GAP (64u << 10)   /* SLUICE_READ_GAP's default: reads this close share one I/O */

static struct sluice_engine *eng;
static struct sluice_file *fa, *fb, *fw;
static char mem[8 << 20];

static struct sluice_range R(struct sluice_file *f, uint64_t off, size_t len, size_t at)
{
	return (struct sluice_range){ f, off, len, mem + at };
}

/* Plans n ranges; the job's segments as (offset, length, pieces) are checked by the caller. */
static int plan(struct sl__job *job, int op, const struct sluice_range *r, size_t n)
{
	return sl__plan(eng, job, op, r, n, 0);
}

static void test_a_range_longer_than_a_chunk_splits_at_each_chunk(void)
{
	struct sl__job j;
	struct sluice_range r = R(fa, 0, 3 * CHUNK + CHUNK / 2, 0);

	T_CHECK(plan(&j, SL_IO_READ, &r, 1) == 0 && j.nsegs == 4 && j.npieces == 4);
	for (size_t s = 0; s < j.nsegs; s++) {
		T_CHECK(j.segs[s].off == s * CHUNK && j.segs[s].npieces == 1);
		T_CHECK(j.segs[s].len == (s < 3 ? CHUNK : CHUNK / 2));
		T_CHECK(j.pieces[s].mem == mem + s * CHUNK && j.pieces[s].seg_off == 0 && j.pieces[s].range == 0);
	}
	sl__plan_free(&j);
}

static void test_reads_within_the_gap_share_one_io_and_further_ones_do_not(void)
{
	struct sl__job j;
	struct sluice_range near[2] = { R(fa, 0, 100, 0), R(fa, 100 + GAP, GAP, 1000) };
	struct sluice_range far[2] = { R(fa, 0, 100, 0), R(fa, 101 + GAP, GAP, 1000) };
	/* A gap longer than the range after it (and than a block) is not read: a column slice's rows stay apart. */
	struct sluice_range rows[2] = { R(fa, 0, 2048, 0), R(fa, 16384, 2048, 4096) };
	struct sluice_range block[2] = { R(fa, 0, 100, 0), R(fa, 4196, 50, 4096) };

	if (!sluice_file_direct_ok(fa)) { /* no O_DIRECT here (tmpfs): reads go through memory, no gap is read */
		T_CHECK(plan(&j, SL_IO_READ, near, 2) == 0 && j.nsegs == 2);
		sl__plan_free(&j);
		return;
	}
	T_CHECK(plan(&j, SL_IO_READ, near, 2) == 0 && j.nsegs == 1 && j.npieces == 2);
	T_CHECK(j.segs[0].len == 100 + 2 * GAP && j.pieces[1].seg_off == 100 + GAP);
	sl__plan_free(&j);
	T_CHECK(plan(&j, SL_IO_READ, far, 2) == 0 && j.nsegs == 2);
	sl__plan_free(&j);
	T_CHECK(plan(&j, SL_IO_READ, rows, 2) == 0 && j.nsegs == 2);
	sl__plan_free(&j);
	T_CHECK(plan(&j, SL_IO_READ, block, 2) == 0 && j.nsegs == 1 && j.segs[0].len == 4246);
	sl__plan_free(&j);
}

/*
 * A file read through the page cache (SLUICE_DIRECT auto and the file just
 * written, so cached; or never) reads no gap: neighbouring reads stay two.
 */
static void test_a_cached_file_reads_no_gap(const char *path)
{
	static const char *const direct[] = { "auto", "never" };

	for (size_t k = 0; k < 2; k++) {
		struct sluice_config *cfg;
		struct sluice_engine *e1;
		struct sluice_file *f;
		struct sl__job j;
		struct sluice_range near[2];

		T_CHECK(sluice_config_new(&cfg) == 0 && sluice_config_set(cfg, "direct", direct[k]) == 0 &&
			sluice_config_set(cfg, "threads", "1") == 0 && sluice_config_set(cfg, "gpu", "0") == 0);
		T_CHECK(sluice_engine_open(&e1, cfg) == 0 && sluice_file_open(&f, e1, path, SLUICE_RDONLY) == 0);
		sluice_config_free(cfg);
		near[0] = R(f, 0, 100, 0), near[1] = R(f, 100 + GAP, 50, 1000);
		T_CHECK(sl__plan(e1, &j, SL_IO_READ, near, 2, 0) == 0 && j.nsegs == 2);
		sl__plan_free(&j);
		sluice_file_close(f);
		sluice_engine_close(e1);
	}
}

/* Pages of path's first MiB in the page cache, by mincore on a mapping of it (-1: cannot tell). */
static int cached_pages(const char *path)
{
	int fd = open(path, O_RDONLY), n = 0;
	unsigned char v[256];
	void *m = fd < 0 ? MAP_FAILED : mmap(NULL, 1 << 20, PROT_READ, MAP_SHARED, fd, 0);

	if (m == MAP_FAILED || mincore(m, 1 << 20, v) < 0)
		n = -1;
	for (int i = 0; n >= 0 && i < 256; i++)
		n += v[i] & 1;
	if (m != MAP_FAILED)
		munmap(m, 1 << 20);
	if (fd >= 0)
		close(fd);
	return n;
}

/*
 * SLUICE_DIRECT auto asks the page cache: a file out of it reads the gap
 * (from the storage), the same file once cached does not; asked through
 * cachestat, and through mincore as on kernels without it.
 */
static void test_the_page_cache_decides_the_gap(const char *path, int no_cachestat)
{
	struct sluice_config *cfg;
	struct sluice_engine *e1;
	struct sluice_file *f;
	struct sl__job j;
	struct sluice_range near[2];
	char buf[1 << 16];
	int fd = open(path, O_RDONLY);

	T_CHECK(fd >= 0 && fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
	sl__test_no_cachestat = no_cachestat;
	T_CHECK(sluice_config_new(&cfg) == 0 && sluice_config_set(cfg, "threads", "1") == 0 &&
		sluice_config_set(cfg, "gpu", "0") == 0);
	T_CHECK(sluice_engine_open(&e1, cfg) == 0 && sluice_file_open(&f, e1, path, SLUICE_RDONLY) == 0);
	sluice_config_free(cfg);
	near[0] = R(f, 0, 100, 0), near[1] = R(f, 100 + GAP, GAP, 1000);
	if (!sluice_file_direct_ok(f) || cached_pages(path) != 0) {
		printf("t_plan: the page cache's half skipped: %s\n",
		       sluice_file_direct_ok(f) ? "the file stayed cached after POSIX_FADV_DONTNEED" : "no O_DIRECT here");
	} else {
		T_CHECK(sl__plan(e1, &j, SL_IO_READ, near, 2, 0) == 0 && j.nsegs == 1); /* out of the cache: one I/O */
		sl__plan_free(&j);
		while (read(fd, buf, sizeof(buf)) > 0)
			;
		T_CHECK(sl__plan(e1, &j, SL_IO_READ, near, 2, 0) == 0 && j.nsegs == 2); /* cached: only the bytes */
		sl__plan_free(&j);
	}
	sluice_file_close(f);
	sluice_engine_close(e1);
	sl__test_no_cachestat = 0;
	close(fd);
}

/* SLUICE_READ_GAP 0: only touching reads share an I/O; the setting's range is checked. */
static void test_a_read_gap_of_zero_reads_only_the_ranges(const char *path)
{
	struct sluice_config *cfg;
	struct sluice_engine *e0;
	struct sluice_file *f;
	struct sl__job j;
	struct sluice_range near[2], touching[2];

	T_CHECK(sluice_config_new(&cfg) == 0 && sluice_config_set(cfg, "read_gap", "0") == 0 &&
		sluice_config_set(cfg, "threads", "1") == 0 && sluice_config_set(cfg, "gpu", "0") == 0);
	T_CHECK(sluice_config_set(cfg, "read_gap", "65M") == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_engine_open(&e0, cfg) == 0 && sluice_file_open(&f, e0, path, SLUICE_RDONLY) == 0);
	sluice_config_free(cfg);
	near[0] = R(f, 0, 100, 0), near[1] = R(f, 101, 50, 1000);
	touching[0] = R(f, 0, 100, 0), touching[1] = R(f, 100, 50, 1000);
	T_CHECK(sl__plan(e0, &j, SL_IO_READ, near, 2, 0) == 0 && j.nsegs == 2);
	sl__plan_free(&j);
	T_CHECK(sl__plan(e0, &j, SL_IO_READ, touching, 2, 0) == 0 && j.nsegs == 1 && j.segs[0].len == 150);
	sl__plan_free(&j);
	sluice_file_close(f);
	sluice_engine_close(e0);
}

static void test_unaligned_edges_are_planned_as_asked(void)
{
	struct sl__job j;
	struct sluice_range r = R(fa, 4095, 2, 7);

	/* The planner keeps the caller's bytes; widening to 4 KiB for O_DIRECT is the worker's (a bounce slot). */
	T_CHECK(plan(&j, SL_IO_READ, &r, 1) == 0 && j.nsegs == 1 && j.segs[0].off == 4095 && j.segs[0].len == 2);
	T_CHECK(j.pieces[0].mem == mem + 7);
	sl__plan_free(&j);
}

static void test_no_segment_crosses_a_chunk_even_when_ranges_touch(void)
{
	struct sl__job j;
	struct sluice_range r[2] = { R(fa, 0, CHUNK - 10, 0), R(fa, CHUNK - 10, 100, CHUNK) };

	T_CHECK(plan(&j, SL_IO_READ, r, 2) == 0);
	for (size_t s = 0; s < j.nsegs; s++)
		T_CHECK(j.segs[s].len <= CHUNK);
	T_CHECK(j.nsegs == 2 && j.npieces == 3 && j.segs[1].off == CHUNK);
	sl__plan_free(&j);
}

static void test_ranges_are_sorted_by_file_and_offset_and_keep_their_index(void)
{
	struct sl__job j;
	struct sluice_range r[3] = { R(fb, 10, 5, 0), R(fa, 500, 5, 100), R(fa, 0, 5, 200) };

	T_CHECK(plan(&j, SL_IO_READ, r, 3) == 0 && j.npieces == 3);
	for (size_t p = 0; p + 1 < j.npieces; p++) {
		const struct sl__seg *s = NULL;

		for (size_t k = 0; k < j.nsegs; k++)
			if (p >= j.segs[k].piece0 && p < j.segs[k].piece0 + j.segs[k].npieces)
				s = &j.segs[k];
		T_CHECK(s != NULL);
	}
	/* In the job, by file then offset; each piece names the caller's range it came from. */
	T_CHECK(j.pieces[0].mem == mem + 200 && j.pieces[0].range == 2);
	T_CHECK(j.pieces[1].mem == mem + 100 && j.pieces[1].range == 1);
	T_CHECK(j.pieces[2].mem == mem + 0 && j.pieces[2].range == 0);
	sl__plan_free(&j);
}

static void test_writes_join_only_when_contiguous_and_only_the_last_may_pad(void)
{
	struct sl__job j;
	struct sluice_range gap[2] = { R(fw, 0, 100, 0), R(fw, 101, 100, 200) };
	struct sluice_range tail[2] = { R(fw, 0, 4096, 0), R(fw, 4096, 100, 4096) };

	T_CHECK(plan(&j, SL_IO_WRITE, gap, 2) == 0 && j.nsegs == 2);
	sl__plan_free(&j);
	T_CHECK(plan(&j, SL_IO_WRITE, tail, 2) == 0 && j.nsegs == 1 && j.segs[0].len == 4196);
	T_CHECK(j.segs[0].pad_ok); /* it ends the job past the file's end (an empty file) */
	sl__plan_free(&j);
}

static void test_bad_ranges_are_refused_with_their_reason(void)
{
	struct sl__job j;
	struct sluice_range past = R(fa, 1 << 20, 1, 0), none = { NULL, 0, 1, mem };
	struct sluice_range ro = R(fa, 0, 10, 0);

	T_CHECK(plan(&j, SL_IO_READ, &past, 1) == SLUICE_ERANGE && strstr(sluice_last_error_detail(), "passes the end"));
	T_CHECK(plan(&j, SL_IO_READ, &none, 1) == -EINVAL);
	T_CHECK(plan(&j, SL_IO_WRITE, &ro, 1) == -EBADF && strstr(sluice_last_error_detail(), "SLUICE_RDWR"));
	T_CHECK(plan(&j, SL_IO_READ, NULL, 0) == 0 && j.nsegs == 0);
}

/*
 * A read smaller than one I/O a worker is cut into a share for each worker
 * (not below 128 KiB, and at 4 KiB bounds); a write is not, nor a read of
 * a worker's I/O or more.
 */
static void test_a_small_read_is_shared_among_the_workers(const char *path)
{
	struct sluice_config *cfg;
	struct sluice_engine *e3;
	struct sluice_file *f;
	struct sl__job j;
	struct sluice_range whole = { NULL, 0, 1 << 20, mem }, small = { NULL, 0, 200 << 10, mem };

	T_CHECK(sluice_config_new(&cfg) == 0 && sluice_config_set(cfg, "max_transfer_size", "1M") == 0 &&
		sluice_config_set(cfg, "threads", "3") == 0 && sluice_config_set(cfg, "gpu", "0") == 0);
	T_CHECK(sluice_engine_open(&e3, cfg) == 0 && sluice_file_open(&f, e3, path, SLUICE_RDONLY) == 0);
	sluice_config_free(cfg);
	whole.file = small.file = f;
	T_CHECK(sl__plan(e3, &j, SL_IO_READ, &whole, 1, 0) == 0 && j.nsegs == 3);
	for (size_t s = 0; s < j.nsegs; s++)
		T_CHECK(j.segs[s].off == s * (344u << 10) && j.segs[s].len == (s < 2 ? 344u << 10 : 336u << 10));
	sl__plan_free(&j);
	T_CHECK(sl__plan(e3, &j, SL_IO_READ, &small, 1, 0) == 0 && j.nsegs == 2 && j.segs[0].len == 128u << 10);
	sl__plan_free(&j);
	sluice_file_close(f);
	sluice_engine_close(e3);
}

int main(void)
{
	const char *dir = t_dir("t_plan");
	char a[512], b[512], w[512];
	struct sluice_config *cfg;

	snprintf(a, sizeof(a), "%s/a.bin", dir);
	snprintf(b, sizeof(b), "%s/b.bin", dir);
	snprintf(w, sizeof(w), "%s/w.bin", dir);
	free(t_make_file(a, 1 << 20, 1));
	free(t_make_file(b, 4096, 2));
	/* direct=always: reads go to the storage however much of the file is cached, so gaps are read through. */
	T_CHECK(sluice_config_new(&cfg) == 0 && sluice_config_set(cfg, "max_transfer_size", "256K") == 0 &&
		sluice_config_set(cfg, "threads", "1") == 0 && sluice_config_set(cfg, "gpu", "0") == 0 &&
		sluice_config_set(cfg, "direct", "always") == 0);
	if (sluice_engine_open(&eng, cfg)) {
		printf("SKIP: %s\n", sluice_last_error_detail());
		return T_SKIP;
	}
	sluice_config_free(cfg);
	T_CHECK(sluice_file_open(&fa, eng, a, SLUICE_RDONLY) == 0 && sluice_file_open(&fb, eng, b, SLUICE_RDONLY) == 0 &&
		sluice_file_open(&fw, eng, w, SLUICE_RDWR | SLUICE_CREATE) == 0);
	test_a_range_longer_than_a_chunk_splits_at_each_chunk();
	test_reads_within_the_gap_share_one_io_and_further_ones_do_not();
	test_a_read_gap_of_zero_reads_only_the_ranges(a);
	test_a_cached_file_reads_no_gap(a);
	test_a_small_read_is_shared_among_the_workers(a);
	test_the_page_cache_decides_the_gap(a, 0);
	test_the_page_cache_decides_the_gap(a, 1);
	test_unaligned_edges_are_planned_as_asked();
	test_no_segment_crosses_a_chunk_even_when_ranges_touch();
	test_ranges_are_sorted_by_file_and_offset_and_keep_their_index();
	test_writes_join_only_when_contiguous_and_only_the_last_may_pad();
	test_bad_ranges_are_refused_with_their_reason();
	sluice_file_close(fa);
	sluice_file_close(fb);
	sluice_file_close(fw);
	sluice_engine_close(eng);
	return t_done("t_plan");
}
