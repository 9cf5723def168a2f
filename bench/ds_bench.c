/*
 * Dataset micro-benchmarks (public API only).
 *
 *   ds_bench make DIR N              a dataset of N records (8-byte i64 field)
 *   ds_bench open DIR REPS           median time of sluice_dataset_open+close,
 *                                    page cache dropped before each (root)
 *   ds_bench resident DIR K          touch records 0..K-1 after a cold open;
 *                                    resident bytes of index.sli per record touched
 * Prints one JSON object.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sluice.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int drop(void)
{
	int fd;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return 0;
	int ok = write(fd, "3", 1) == 1;

	close(fd);
	return ok;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Bytes of path currently in the page cache. */
static uint64_t resident(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	uint64_t r = 0;

	if (fd < 0 || fstat(fd, &st) < 0)
		return 0;
	size_t pages = ((size_t)st.st_size + 4095) / 4096;
	unsigned char *vec = malloc(pages);
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);

	if (m != MAP_FAILED && vec && mincore(m, (size_t)st.st_size, vec) == 0)
		for (size_t p = 0; p < pages; p++)
			r += (vec[p] & 1) ? 4096 : 0;
	if (m != MAP_FAILED)
		munmap(m, (size_t)st.st_size);
	free(vec);
	close(fd);
	return r;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: ds_bench make|open|resident DIR N\n");
		return 2;
	}
	const char *dir = argv[2];
	uint64_t n = strtoull(argv[3], NULL, 10);

	if (!strcmp(argv[1], "make")) {
		struct sluice_field f[1] = { { "v", SLUICE_DTYPE_I64, 0, { 0 } } };
		struct sluice_writer *w;
		struct sluice_writer_options opt = { 4ull << 30 };
		double t0 = now();

		if (sluice_writer_open(&w, dir, f, 1, &opt))
			return 1;
		for (uint64_t i = 0; i < n; i++) {
			int64_t v = (int64_t)i;
			const void *vals[1] = { &v };
			size_t len = 8;

			if (sluice_writer_add(w, vals, &len))
				return 1;
		}
		if (sluice_writer_close(w))
			return 1;
		printf("{\"made\":%llu,\"seconds\":%.2f}\n", (unsigned long long)n, now() - t0);
		return 0;
	}
	if (!strcmp(argv[1], "open")) {
		double *t = calloc(n, sizeof(double));
		int dropped = 1;

		for (uint64_t r = 0; r < n; r++) {
			struct sluice_dataset *ds;
			double t0;

			dropped &= drop();
			t0 = now();
			if (sluice_dataset_open(&ds, dir))
				return 1;
			t[r] = now() - t0;
			if (r == 0)
				printf("{\"records\":%llu,", (unsigned long long)sluice_dataset_count(ds));
			sluice_dataset_close(ds);
		}
		qsort(t, n, sizeof(double), cmp);
		printf("\"cold\":%s,\"open_ms_median\":%.3f,\"open_ms_max\":%.3f}\n", dropped ? "true" : "false",
		       t[n / 2] * 1e3, t[n - 1] * 1e3);
		return 0;
	}
	if (!strcmp(argv[1], "resident")) {
		struct sluice_dataset *ds;
		struct sluice_record_loc loc;
		char ix[4096];
		uint64_t sum = 0, before;

		snprintf(ix, sizeof(ix), "%s/index.sli", dir);
		drop();
		before = resident(ix);
		if (sluice_dataset_open(&ds, dir))
			return 1;
		for (uint64_t i = 0; i < n && i < sluice_dataset_count(ds); i++)
			if (sluice_dataset_locate(ds, i, &loc) == 0)
				sum += loc.length;
		uint64_t after = resident(ix);

		printf("{\"touched\":%llu,\"resident_before\":%llu,\"resident_after\":%llu,\"bytes_per_record\":%.3f,\"check\":%llu}\n",
		       (unsigned long long)n, (unsigned long long)before, (unsigned long long)after,
		       (double)(after - before) / (double)n, (unsigned long long)sum);
		sluice_dataset_close(ds);
		return 0;
	}
	return 2;
}
