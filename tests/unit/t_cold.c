/*
 * sluice_page_cache_evict (bench --cold, load --cold): exactly the file
 * named leaves the page cache, its dirty pages written first, and what
 * stays (a mapped file, tmpfs) is counted and said, checked page by page
 * with mincore(2).  The eviction is checked on a disk filesystem: where
 * the test directory is on tmpfs the test is skipped, saying so.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "core/core.h"
#include "t_util.h"

#define T_SIZE (8u << 20)

static const char *dir;

/* The pages of path in the page cache, by mincore over a mapping of it (mapping faults none in). */
static size_t resident(const char *path)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	unsigned char vec[T_SIZE / 4096 + 1];
	int fd = open(path, O_RDONLY);
	struct stat st;
	size_t n = 0;
	void *m;

	if (fd < 0 || fstat(fd, &st) < 0 || !st.st_size || (size_t)st.st_size > T_SIZE)
		return (size_t)-1;
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED || mincore(m, (size_t)st.st_size, vec) < 0)
		return (size_t)-1;
	for (size_t i = 0; i < ((size_t)st.st_size + page - 1) / page; i++)
		n += vec[i] & 1;
	munmap(m, (size_t)st.st_size);
	return n;
}

static void read_all(const char *path)
{
	char buf[1 << 16];
	int fd = open(path, O_RDONLY);

	while (fd >= 0 && read(fd, buf, sizeof(buf)) > 0)
		;
	if (fd >= 0)
		close(fd);
}

static int on_tmpfs(const char *path)
{
	struct statfs fs;

	return statfs(path, &fs) == 0 && (fs.f_type == 0x01021994 || fs.f_type == 0x858458f6);
}

/* The file read leaves the cache; another file read just as recently stays (nothing but it is dropped). */
static int test_exactly_the_file_goes(void)
{
	char a[600], b[600], why[256];
	uint64_t cached = 1;
	int f0 = t_failures, kept = 0;

	snprintf(a, sizeof(a), "%s/a.bin", dir);
	snprintf(b, sizeof(b), "%s/b.bin", dir);
	free(t_make_file(a, T_SIZE, 1));
	free(t_make_file(b, T_SIZE, 2));
	sync();
	/*
	 * b must stay: tried a few times, for another process on the machine
	 * may drop the whole page cache meanwhile (what this call is not).
	 */
	for (int tries = 0; tries < 5 && !kept; tries++) {
		read_all(a);
		read_all(b);
		T_CHECK(resident(a) > 0);
		T_CHECK(sluice_page_cache_evict(a, &cached, why, sizeof(why)) == 0);
		T_CHECK(cached == 0 && why[0] == 0);
		T_CHECK(resident(a) == 0);
		kept = resident(b) * 4096 >= T_SIZE / 2;
	}
	T_CHECK(kept); /* b was not evicted with a */
	return t_failures != f0;
}

/* Pages written and not yet on disk are written back first, then go: the bytes read after are the bytes written. */
static int test_dirty_pages_are_written_first(void)
{
	char p[600], why[256];
	uint64_t cached = 1;
	size_t n = 0;
	char *want, *got;
	int f0 = t_failures;

	snprintf(p, sizeof(p), "%s/dirty.bin", dir);
	want = t_make_file(p, T_SIZE, 3); /* no fsync: its pages are dirty */
	T_CHECK(sluice_page_cache_evict(p, &cached, why, sizeof(why)) == 0 && cached == 0 && !why[0]);
	T_CHECK(resident(p) == 0);
	got = t_slurp(p, &n);
	T_CHECK(got && n == T_SIZE && !memcmp(want, got, T_SIZE));
	free(want);
	free(got);
	return t_failures != f0;
}

/* Pages a process maps and locks stay: counted, and why said; the file is not called cold. */
static int test_what_stays_is_said(void)
{
	char p[600], why[256];
	uint64_t cached = 0;
	int fd, f0 = t_failures;
	void *m;

	snprintf(p, sizeof(p), "%s/mapped.bin", dir);
	free(t_make_file(p, T_SIZE, 4));
	fd = open(p, O_RDONLY);
	m = fd >= 0 ? mmap(NULL, T_SIZE, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
	T_CHECK(m != MAP_FAILED);
	if (m != MAP_FAILED && mlock(m, T_SIZE) == 0) {
		T_CHECK(sluice_page_cache_evict(p, &cached, why, sizeof(why)) == 0);
		T_CHECK(cached == T_SIZE && strstr(why, "mapped or locked"));
		munlock(m, T_SIZE);
	} else {
		fprintf(stderr, "t_cold: mlock refused (%s): the locked-pages case is not checked\n", strerror(errno));
	}
	if (m != MAP_FAILED)
		munmap(m, T_SIZE);
	if (fd >= 0)
		close(fd);
	return t_failures != f0;
}

/* On tmpfs nothing can go (there is no disk behind it): said, not called cold. */
static int test_tmpfs_is_said(void)
{
	char p[600], why[256];
	uint64_t cached = 0;
	int f0 = t_failures;

	if (!on_tmpfs("/dev/shm")) {
		fprintf(stderr, "t_cold: /dev/shm is not tmpfs here: the tmpfs case is not checked\n");
		return 0;
	}
	snprintf(p, sizeof(p), "/dev/shm/t_cold-%d", (int)getpid());
	free(t_make_file(p, 1 << 20, 5));
	T_CHECK(sluice_page_cache_evict(p, &cached, why, sizeof(why)) == 0);
	T_CHECK(cached == 1 << 20 && strstr(why, "tmpfs"));
	unlink(p);
	return t_failures != f0;
}

/* What is no regular file is refused naming it, as every path from outside is. */
static int test_bad_paths_are_named(void)
{
	char p[600];
	int f0 = t_failures;

	snprintf(p, sizeof(p), "%s/none", dir);
	T_CHECK(sluice_page_cache_evict(p, NULL, NULL, 0) == -ENOENT && strstr(sluice_last_error_detail(), p));
	snprintf(p, sizeof(p), "%s/fifo", dir);
	T_CHECK(mkfifo(p, 0600) == 0 || errno == EEXIST);
	T_CHECK(sluice_page_cache_evict(p, NULL, NULL, 0) == -EINVAL && strstr(sluice_last_error_detail(), "FIFO"));
	T_CHECK(sluice_page_cache_evict(dir, NULL, NULL, 0) == -EISDIR);
	return t_failures != f0;
}

static const struct {
	const char *name;
	int (*fn)(void);
} tests[] = {
	{ "exactly the file goes", test_exactly_the_file_goes },
	{ "dirty pages are written first", test_dirty_pages_are_written_first },
	{ "what stays is said", test_what_stays_is_said },
	{ "tmpfs is said", test_tmpfs_is_said },
	{ "bad paths are named", test_bad_paths_are_named },
};

int main(void)
{
	dir = t_dir("t_cold");
	if (on_tmpfs(dir)) {
		fprintf(stderr, "t_cold: SKIP: %s is on tmpfs, which keeps its files in memory alone: eviction is checked "
			"only on a disk filesystem (set SLUICE_TEST_DIR to one)\n", dir);
		return T_SKIP;
	}
	/* Counted by cachestat, then as a kernel before 6.5 counts: by mincore. */
	for (sl__test_no_cachestat = 0; sl__test_no_cachestat < 2; sl__test_no_cachestat++)
		for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
			if (tests[i].fn())
				fprintf(stderr, "t_cold: FAILED: %s%s\n", tests[i].name,
					sl__test_no_cachestat ? " (mincore)" : "");
	return t_done("t_cold");
}
