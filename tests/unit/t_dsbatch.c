/*
 * Batched dataset reads through the engine: every record lands where
 * offsets[] says, byte for byte as a single-record read gives it; runs of
 * neighbours become few I/Os (read in place through the page cache); records larger than one I/O are checked by
 * folding their pieces' CRCs; a corrupt record is named; no room, no read.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "t_util.h"
#include "dsread/dsread.h"

static const struct sluice_field fields[] = {
	{ "blob", SLUICE_DTYPE_BYTES, 0, { 0 } },
	{ "label", SLUICE_DTYPE_I64, 0, { 0 } },
};

/* Record i: every 50th is 200 KB (over the 64 KiB I/O size), the rest small. */
static size_t blob_len(uint64_t i)
{
	return i % 50 == 7 ? 200000 + (size_t)i : 1 + (size_t)(i * 97) % 3000;
}

static void check_batch(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx, size_t n,
			struct sluice_xfer_report *rep)
{
	size_t cap = 0;

	for (size_t k = 0; k < n; k++) {
		struct sluice_record_loc loc;

		T_CHECK(sluice_dataset_locate(ds, idx[k], &loc) == 0);
		cap += loc.length + 8;
	}
	char *dst = malloc(cap), *one = malloc(300000);
	uint64_t *off = malloc((n + 1) * sizeof(uint64_t));
	ssize_t got = sluice_dataset_read_batch(eng, ds, idx, n, dst, cap, off, rep);

	T_CHECK(got > 0 && (uint64_t)got == off[n]);
	for (size_t k = 0; k < n && got > 0; k++) {
		ssize_t l = sluice_dataset_read(ds, idx[k], one, 300000, NULL);

		T_CHECK(l > 0 && off[k] % 8 == 0 && !memcmp(dst + off[k], one, (size_t)l));
	}
	T_CHECK(sluice_dataset_read_batch(eng, ds, idx, n, dst, 10, off, NULL) == -ENOSPC);
	free(dst);
	free(one);
	free(off);
}

static void write_ds(const char *path, const struct sluice_writer_options *opt, uint64_t n, char *blob)
{
	struct sluice_writer *w;

	T_CHECK(sluice_writer_open(&w, path, fields, 2, opt) == 0);
	for (uint64_t i = 0; i < n; i++) {
		int64_t label = (int64_t)i;
		size_t l[2] = { blob_len(i), 8 };
		const void *v[2] = { blob, &label };

		t_fill(blob, l[0], i);
		T_CHECK(sluice_writer_add(w, v, l) == 0);
	}
	T_CHECK(sluice_writer_close(w) == 0);
}

int main(void)
{
	const char *dir = t_dir("t_dsbatch");
	char path[600], *blob = malloc(300000);
	struct sluice_writer_options opt = { .size = sizeof(struct sluice_writer_options), .shard_size = 1 << 20 };
	struct sluice_dataset *ds;
	struct sluice_engine *eng;
	struct sluice_config *cfg;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	const uint64_t n = 400;
	uint64_t all[400], rnd[300], s = 1;

	snprintf(path, sizeof(path), "%s/ds", dir);
	write_ds(path, &opt, n, blob);
	T_CHECK(sluice_dataset_open(&ds, path) == 0);

	unsetenv("SLUICE_MAX_TRANSFER_SIZE");
	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(sluice_config_set_max_transfer_size(cfg, 64 << 10) == 0);
	T_CHECK(sluice_config_set_threads(cfg, 3) == 0);
	T_CHECK(sluice_engine_open(&eng, cfg) == 0);
	sluice_config_free(cfg);

	for (uint64_t i = 0; i < n; i++)
		all[i] = i;
	check_batch(eng, ds, all, n, &rep);
	printf("sequential batch of %llu records: %llu I/Os, path %s\n", (unsigned long long)n,
	       (unsigned long long)rep.ios, rep.path);
	T_CHECK(rep.ios < n / 2);
	{
		/* Through the page cache, neighbours land in place: one copy, no bounce buffer. */
		struct sluice_engine *buffered;

		T_CHECK(sluice_config_new(&cfg) == 0);
		T_CHECK(sluice_config_set_max_transfer_size(cfg, 64 << 10) == 0);
		T_CHECK(sluice_config_set_direct(cfg, SLUICE_DIRECT_NEVER) == 0);
		T_CHECK(sluice_engine_open(&buffered, cfg) == 0);
		sluice_config_free(cfg);
		check_batch(buffered, ds, all, n, &rep);
		printf("buffered: %llu I/Os, path %s\n", (unsigned long long)rep.ios, rep.path);
		T_CHECK(rep.ios < n / 2 && strstr(rep.path, "buffered>host") && !strstr(rep.path, "bounce"));
		sluice_engine_close(buffered);
	}
	for (int k = 0; k < 300; k++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		rnd[k] = (s >> 20) % n;
	}
	rnd[1] = rnd[0]; /* a duplicate */
	check_batch(eng, ds, rnd, 300, NULL);
	{
		/* The same records in zstd blocks: decompressed on the way. */
		struct sluice_writer_options zopt = { .size = sizeof(struct sluice_writer_options), .shard_size = 2 << 20, .zstd_level = 1 };
		struct sluice_dataset *zds;
		char zpath[620];

		snprintf(zpath, sizeof(zpath), "%s/zds", dir);
		write_ds(zpath, &zopt, n, blob);
		T_CHECK(sluice_dataset_open(&zds, zpath) == 0);
		check_batch(eng, zds, all, n, NULL);
		check_batch(eng, zds, rnd, 300, NULL);
		/*
		 * Every batch of ds above used its files bound at their first use:
		 * one open a shard, not one a batch (zds's blocks are decoded by the
		 * CPU from the dataset's own descriptors).
		 */
		printf("files the engine opened for datasets: %llu (ds has %u shards)\n",
		       (unsigned long long)sl__bind_opens(eng), sluice_dataset_shards(ds));
		T_CHECK(sl__bind_opens(eng) == sluice_dataset_shards(ds));
		sluice_dataset_close(zds);
	}

	/* A corrupt byte inside a large record (checked from several pieces). */
	struct sluice_record_loc loc;
	char shard[700];
	uint64_t bad = 57;
	size_t cap = 400000;
	char *dst = malloc(cap);

	T_CHECK(sluice_dataset_locate(ds, bad, &loc) == 0 && loc.length > 64 * 1024);
	snprintf(shard, sizeof(shard), "%s/shard-%06u.sls", path, loc.shard);
	int fd = open(shard, O_RDWR);
	char c;

	T_CHECK(fd >= 0 && pread(fd, &c, 1, (off_t)(loc.offset + 150000)) == 1);
	c ^= 1;
	T_CHECK(pwrite(fd, &c, 1, (off_t)(loc.offset + 150000)) == 1);
	uint64_t three[3] = { 56, 57, 58 };

	T_CHECK(sluice_dataset_read_batch(eng, ds, three, 3, dst, cap, NULL, NULL) == SLUICE_ECRC);
	T_CHECK(strstr(sluice_last_error_detail(), "record 57") != NULL);
	c ^= 1;
	T_CHECK(pwrite(fd, &c, 1, (off_t)(loc.offset + 150000)) == 1);
	close(fd);
	T_CHECK(sluice_dataset_read_batch(eng, ds, three, 3, dst, cap, NULL, NULL) > 0);
	uint64_t past = n;

	T_CHECK(sluice_dataset_read_batch(eng, ds, &past, 1, dst, cap, NULL, NULL) == SLUICE_ERANGE);
	free(dst);
	free(blob);
	sluice_dataset_close(ds);
	sluice_engine_close(eng);
	return t_done("t_dsbatch");
}
