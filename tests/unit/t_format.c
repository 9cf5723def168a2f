/*
 * Native dataset format: write and read back across several shards with
 * typed and byte fields; corrupt, truncated and inconsistent files are
 * found and named by read and verify; a writer that never closed leaves
 * no dataset; bad schemas and values are refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t_util.h"

static const char *dir;
static char ds_path[600];

struct bad_log {
	int n;
	uint64_t rec[16];
	int code[16];
};

static void on_bad(const struct sluice_bad *b, void *user)
{
	struct bad_log *l = user;

	printf("  verify: record %lld shard %u: %s (%s)\n", b->record == UINT64_MAX ? -1LL : (long long)b->record,
	       b->shard, b->what, sluice_strerror(b->code));
	if (l->n < 16) {
		l->rec[l->n] = b->record;
		l->code[l->n] = b->code;
	}
	l->n++;
}

/* Record i: tokens of i % 50 + 1 u16 values, a fixed i64 label, a byte blob. */
static void make_record(uint64_t i, uint16_t *tok, size_t *ntok, int64_t *label, char *blob, size_t *nblob)
{
	*ntok = i % 50 + 1;
	for (size_t k = 0; k < *ntok; k++)
		tok[k] = (uint16_t)(i * 31 + k);
	*label = (int64_t)i * 7 - 3;
	*nblob = (i * 13) % 300;
	t_fill(blob, *nblob, i);
}

static const struct sluice_field fields[] = {
	{ "tokens", SLUICE_DTYPE_U16, 1, { -1 } },
	{ "label", SLUICE_DTYPE_I64, 0, { 0 } },
	{ "blob", SLUICE_DTYPE_BYTES, 0, { 0 } },
};

static void write_ds(const char *path, uint64_t n, const struct sluice_writer_options *opt)
{
	struct sluice_writer *w;
	uint16_t tok[64];
	char blob[300];
	size_t ntok, nblob;
	int64_t label;

	T_CHECK(sluice_writer_open(&w, path, fields, 3, opt) == 0);
	for (uint64_t i = 0; i < n; i++) {
		make_record(i, tok, &ntok, &label, blob, &nblob);
		const void *v[3] = { tok, &label, blob };
		size_t l[3] = { ntok * 2, 8, nblob };

		T_CHECK(sluice_writer_add(w, v, l) == 0);
	}
	T_CHECK(sluice_writer_count(w) == n);
	T_CHECK(sluice_writer_close(w) == 0);
}

/* Every record of the dataset at path, in order (step 1) or strided, as written. */
static void read_ds(const char *path, uint64_t n, uint64_t step)
{
	struct sluice_dataset *ds;
	struct sluice_record rec;
	uint16_t tok[64];
	char blob[300], buf[4096];
	size_t ntok, nblob;
	int64_t label;

	T_CHECK(sluice_dataset_open(&ds, path) == 0);
	T_CHECK(sluice_dataset_count(ds) == n);
	T_CHECK(sluice_dataset_shards(ds) > 1);
	T_CHECK(sluice_dataset_nfields(ds) == 3);
	T_CHECK(!strcmp(sluice_dataset_field(ds, 0)->name, "tokens") && sluice_dataset_field(ds, 0)->shape[0] == -1);
	T_CHECK(sluice_dataset_field(ds, 1)->dtype == SLUICE_DTYPE_I64 && sluice_dataset_field(ds, 3) == NULL);
	for (uint64_t k = 0, i = 0; k < n; k++, i = (i + step) % n) {
		make_record(i, tok, &ntok, &label, blob, &nblob);
		T_CHECK(sluice_dataset_read(ds, i, buf, sizeof(buf), &rec) > 0);
		T_CHECK(rec.len[0] == ntok * 2 && !memcmp(rec.data[0], tok, ntok * 2));
		T_CHECK(rec.len[1] == 8 && !memcmp(rec.data[1], &label, 8));
		T_CHECK(rec.len[2] == nblob && !memcmp(rec.data[2], blob, nblob));
		T_CHECK(((uintptr_t)rec.data[0] - (uintptr_t)buf) % 8 == 0);
	}
	T_CHECK(sluice_dataset_read(ds, n, buf, sizeof(buf), &rec) == SLUICE_ERANGE);
	T_CHECK(sluice_dataset_read(ds, 0, buf, 3, &rec) == -ENOSPC);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
}

static void t_roundtrip(uint64_t n)
{
	struct sluice_writer_options opt = { .size = sizeof(struct sluice_writer_options), .shard_size = 64 << 10 };

	snprintf(ds_path, sizeof(ds_path), "%s/ds", dir);
	write_ds(ds_path, n, &opt);
	read_ds(ds_path, n, 1);
}

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char c;

	T_CHECK(fd >= 0 && pread(fd, &c, 1, off) == 1);
	c ^= 0x40;
	T_CHECK(pwrite(fd, &c, 1, off) == 1);
	close(fd);
}

static void t_corruption(void)
{
	struct sluice_dataset *ds;
	struct sluice_record_loc loc;
	struct bad_log log = { 0 };
	char shard[700], buf[4096];

	/* One flipped bit inside record 10: read and verify both name it. */
	T_CHECK(sluice_dataset_open(&ds, ds_path) == 0);
	T_CHECK(sluice_dataset_locate(ds, 10, &loc) == 0);
	snprintf(shard, sizeof(shard), "%s/shard-%06u.sls", ds_path, loc.shard);
	flip_byte(shard, (off_t)(loc.offset + loc.length - 1));
	T_CHECK(sluice_dataset_read(ds, 10, buf, sizeof(buf), NULL) == SLUICE_ECRC);
	T_CHECK(strstr(sluice_last_error_detail(), "record 10") && strstr(sluice_last_error_detail(), "shard-"));
	T_CHECK(sluice_dataset_read(ds, 11, buf, sizeof(buf), NULL) > 0);
	T_CHECK(sluice_dataset_verify(ds, on_bad, &log) == 1);
	T_CHECK(log.n == 1 && log.rec[0] == 10 && log.code[0] == SLUICE_ECRC);
	flip_byte(shard, (off_t)(loc.offset + loc.length - 1));

	/* A truncated last shard: its header disagrees and its records are unreadable. */
	unsigned last = sluice_dataset_shards(ds) - 1;

	snprintf(shard, sizeof(shard), "%s/shard-%06u.sls", ds_path, last);
	struct stat st;

	T_CHECK(stat(shard, &st) == 0 && truncate(shard, st.st_size - 100) == 0);
	memset(&log, 0, sizeof(log));
	T_CHECK(sluice_dataset_verify(ds, on_bad, &log) >= 2);
	T_CHECK(log.rec[0] == UINT64_MAX);
	T_CHECK(sluice_dataset_read(ds, sluice_dataset_count(ds) - 1, buf, sizeof(buf), NULL) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "truncated") != NULL);
	T_CHECK(truncate(shard, st.st_size) == 0); /* zeros now: CRC catches them */
	memset(&log, 0, sizeof(log));
	T_CHECK(sluice_dataset_verify(ds, on_bad, &log) >= 1 && log.code[0] == SLUICE_ECRC);
	sluice_dataset_close(ds);

	/* Index damage: flipped header, bad magic, truncated entries. */
	char ix[700];

	snprintf(ix, sizeof(ix), "%s/index.sli", ds_path);
	flip_byte(ix, 20);
	T_CHECK(sluice_dataset_open(&ds, ds_path) == SLUICE_EFORMAT && ds == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), "index.sli") && strstr(sluice_last_error_detail(), "CRC"));
	flip_byte(ix, 20);
	flip_byte(ix, 0);
	T_CHECK(sluice_dataset_open(&ds, ds_path) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "magic") != NULL);
	flip_byte(ix, 0);
	T_CHECK(stat(ix, &st) == 0 && truncate(ix, st.st_size - 16) == 0);
	T_CHECK(sluice_dataset_open(&ds, ds_path) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "records need") != NULL);
}

static void t_writer_errors(void)
{
	struct sluice_writer *w;
	char p[700];
	struct sluice_field bad[2] = { { "x", SLUICE_DTYPE_U8, 0, { 0 } }, { "x", SLUICE_DTYPE_U8, 0, { 0 } } };
	struct sluice_field fixed[1] = { { "img", SLUICE_DTYPE_F32, 2, { 2, 3 } } };
	float img[6] = { 0 };

	snprintf(p, sizeof(p), "%s/bad", dir);
	T_CHECK(sluice_writer_open(&w, p, bad, 2, NULL) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "twice") != NULL);
	bad[1].name = "a/b";
	T_CHECK(sluice_writer_open(&w, p, bad, 2, NULL) == SLUICE_EINVAL_CONFIG);
	bad[1].name = "y";
	bad[1].dtype = (enum sluice_dtype)42;
	T_CHECK(sluice_writer_open(&w, p, bad, 2, NULL) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_writer_open(&w, p, bad, 0, NULL) == SLUICE_EINVAL_CONFIG);
	/* A dataset that exists is not overwritten. */
	T_CHECK(sluice_writer_open(&w, ds_path, fixed, 1, NULL) == -EEXIST);

	/* Fixed shapes are enforced; a writer that never closes leaves no dataset. */
	snprintf(p, sizeof(p), "%s/fixed", dir);
	T_CHECK(sluice_writer_open(&w, p, fixed, 1, NULL) == 0);
	const void *v[1] = { img };
	size_t l[1] = { 24 };

	T_CHECK(sluice_writer_add(w, v, l) == 0);
	l[0] = 20;
	T_CHECK(sluice_writer_add(w, v, l) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "record 1") && strstr(sluice_last_error_detail(), "img"));
	struct sluice_dataset *ds;

	T_CHECK(sluice_dataset_open(&ds, p) == -ENOENT);
	T_CHECK(strstr(sluice_last_error_detail(), "did not finish") != NULL);
	sluice_writer_abort(w);
	T_CHECK(sluice_dataset_open(&ds, p) == -ENOENT);

	/* An empty dataset opens with zero records. */
	snprintf(p, sizeof(p), "%s/empty", dir);
	T_CHECK(sluice_writer_open(&w, p, fixed, 1, NULL) == 0);
	T_CHECK(sluice_writer_close(w) == 0);
	T_CHECK(sluice_dataset_open(&ds, p) == 0 && sluice_dataset_count(ds) == 0);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
}

/* Records larger than the writer's 4 MiB buffer stream through it, between small ones. */
static void t_big_records(void)
{
	static const struct sluice_field f[1] = { { "blob", SLUICE_DTYPE_BYTES, 0, { 0 } } };
	const size_t sizes[5] = { 100, 9u << 20, 4097, (4u << 20) + 3, 1 };
	struct sluice_writer *w;
	struct sluice_dataset *ds;
	char p[700], *b = malloc(10u << 20), *back = malloc(10u << 20);
	struct sluice_record rec;

	snprintf(p, sizeof(p), "%s/big", dir);
	T_CHECK(sluice_writer_open(&w, p, f, 1, NULL) == 0);
	for (int i = 0; i < 5; i++) {
		const void *v[1] = { b };

		t_fill(b, sizes[i], (uint64_t)i + 40);
		T_CHECK(sluice_writer_add(w, v, &sizes[i]) == 0);
	}
	T_CHECK(sluice_writer_close(w) == 0);
	T_CHECK(sluice_dataset_open(&ds, p) == 0);
	for (int i = 0; ds && i < 5; i++) {
		t_fill(b, sizes[i], (uint64_t)i + 40);
		T_CHECK(sluice_dataset_read(ds, (uint64_t)i, back, 10u << 20, &rec) > 0);
		T_CHECK(rec.len[0] == sizes[i] && !memcmp(rec.data[0], b, sizes[i]));
	}
	T_CHECK(ds && sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
	free(b);
	free(back);
}

/* A record whose only field is empty, its value NULL as the writer allows: no memcpy from NULL (UBSan). */
static void test_a_record_of_one_empty_field(void)
{
	static const struct sluice_field f[1] = { { "blob", SLUICE_DTYPE_BYTES, 0, { 0 } } };
	const void *v[1] = { NULL };
	const size_t zero = 0;
	struct sluice_writer *w;
	struct sluice_dataset *ds = NULL;
	struct sluice_record rec;
	char p[700], back[64];

	snprintf(p, sizeof(p), "%s/one_empty", dir);
	T_CHECK(sluice_writer_open(&w, p, f, 1, NULL) == 0);
	T_CHECK(sluice_writer_add(w, v, &zero) == 0 && sluice_writer_add(w, v, &zero) == 0);
	T_CHECK(sluice_writer_close(w) == 0);
	T_CHECK(sluice_dataset_open(&ds, p) == 0 && sluice_dataset_count(ds) == 2);
	T_CHECK(ds && sluice_dataset_read(ds, 1, back, sizeof(back), &rec) >= 0 && rec.len[0] == 0);
	T_CHECK(ds && sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
}

static void t_crc(void)
{
	T_CHECK(sluice_crc32c(0, "123456789", 9) == 0xE3069283u);
	T_CHECK(sluice_crc32c(sluice_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u);
	T_CHECK(sluice_crc32c(0, "", 0) == 0);
}

/* zstd blocks: several shards of several blocks, read in order and strided; damage is named. */
static void t_zstd(void)
{
	struct sluice_writer_options opt = { .size = sizeof(struct sluice_writer_options), .shard_size = 3 << 20, .zstd_level = 3, .block_size = 1 << 20 };
	struct sluice_writer *w;
	struct sluice_dataset *ds;
	struct sluice_record_loc loc;
	struct bad_log log = { 0 };
	char path[700], shard[760], buf[4096];
	const uint64_t n = 30000;
	double ratio;

	snprintf(path, sizeof(path), "%s/zds", dir);
	write_ds(path, n, &opt);
	read_ds(path, n, 1);
	read_ds(path, n, 7919); /* a prime: every record, jumping between blocks */
	T_CHECK(sluice_dataset_open(&ds, path) == 0);
	T_CHECK(!strcmp(sluice_dataset_compression(ds, &ratio), "zstd") && ratio > 1.0);

	/* A flipped byte inside a block: the block fails its stored bytes' CRC, and verify names its records. */
	T_CHECK(sluice_dataset_locate(ds, 5, &loc) == 0);
	snprintf(shard, sizeof(shard), "%s/shard-%06u.sls", path, loc.shard);
	flip_byte(shard, 4096 + 2000);
	T_CHECK(sluice_dataset_read(ds, 5, buf, sizeof(buf), NULL) == SLUICE_ECRC);
	T_CHECK(strstr(sluice_last_error_detail(), "block 0: CRC mismatch of its stored bytes") &&
		strstr(sluice_last_error_detail(), "shard-000000"));
	T_CHECK(sluice_dataset_verify(ds, on_bad, &log) > 0 && log.rec[0] == 0 && log.code[0] == SLUICE_ECRC);
	flip_byte(shard, 4096 + 2000);
	sluice_dataset_close(ds);

	/* A damaged block table and a truncated shard are refused by name. */
	struct stat st;

	T_CHECK(stat(shard, &st) == 0);
	flip_byte(shard, st.st_size - 10);
	T_CHECK(sluice_dataset_open(&ds, path) == 0);
	T_CHECK(sluice_dataset_read(ds, 0, buf, sizeof(buf), NULL) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "block table CRC") != NULL);
	sluice_dataset_close(ds);
	flip_byte(shard, st.st_size - 10);
	T_CHECK(truncate(shard, st.st_size - 10) == 0);
	T_CHECK(sluice_dataset_open(&ds, path) == 0);
	memset(&log, 0, sizeof(log));
	T_CHECK(sluice_dataset_verify(ds, on_bad, &log) > 0 && log.rec[0] == UINT64_MAX);
	sluice_dataset_close(ds);

	/* Options out of range. */
	snprintf(path, sizeof(path), "%s/zbad", dir);
	opt.zstd_level = 99;
	T_CHECK(sluice_writer_open(&w, path, fields, 3, &opt) == SLUICE_EINVAL_CONFIG);
	opt.zstd_level = 1;
	opt.block_size = 4096;
	T_CHECK(sluice_writer_open(&w, path, fields, 3, &opt) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "block size") != NULL);
}


/* Little-endian fields of the index header (docs/FORMAT.md), as this test reads and mends them. */
static uint32_t t_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t t_le64(const unsigned char *p)
{
	return t_le32(p) | (uint64_t)t_le32(p + 4) << 32;
}

static void t_put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/*
 * An index entry copied from its neighbour (both records then point at the
 * same bytes, whose CRC matches) is refused when read, naming the index;
 * an index of version 1 (no entry CRCs) still reads.
 */
static void t_index_entries(void)
{
	struct sluice_writer_options opt = { .size = sizeof(struct sluice_writer_options), .shard_size = 64 << 10 };
	struct sluice_dataset *ds;
	char p[700], ix[760], buf[4096], e[12];
	unsigned char h[4096];
	int fd;

	snprintf(p, sizeof(p), "%s/entries", dir);
	write_ds(p, 9000, &opt);
	snprintf(ix, sizeof(ix), "%s/index.sli", p);
	fd = open(ix, O_RDWR);
	T_CHECK(fd >= 0 && pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h));
	T_CHECK(t_le32(h + 8) == 2);
	{
		uint64_t eoff = t_le64(h + 56);

		/* Entry 5000 (the second group) becomes a copy of entry 4999. */
		T_CHECK(pread(fd, e, 12, (off_t)(eoff + 12 * 4999)) == 12 && pwrite(fd, e, 12, (off_t)(eoff + 12 * 5000)) == 12);
	}
	T_CHECK(sluice_dataset_open(&ds, p) == 0);
	T_CHECK(sluice_dataset_read(ds, 1, buf, sizeof(buf), NULL) > 0);
	T_CHECK(sluice_dataset_read(ds, 5000, buf, sizeof(buf), NULL) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "index.sli") && strstr(sluice_last_error_detail(), "damaged"));
	T_CHECK(sluice_dataset_read(ds, 4096, buf, sizeof(buf), NULL) == SLUICE_EFORMAT); /* its group */
	T_CHECK(sluice_dataset_read(ds, 8999, buf, sizeof(buf), NULL) > 0);                /* the next group */
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) > 0);
	sluice_dataset_close(ds);
	/* The same index as version 1 wrote it: no group table in the header's CRC. */
	close(fd);
	snprintf(buf, sizeof(buf), "rm -rf '%s'", p);
	T_CHECK(system(buf) == 0);
	write_ds(p, 9000, &opt);
	fd = open(ix, O_RDWR);
	T_CHECK(fd >= 0 && pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h));
	{
		uint64_t schema = t_le64(h + 32), shards = t_le64(h + 48);
		unsigned nshards = t_le32(h + 24);
		unsigned char *b = malloc(shards + 16 * nshards);

		T_CHECK(b && pread(fd, b, shards + 16 * nshards, 0) == (ssize_t)(shards + 16 * nshards));
		t_put32(h + 8, 1);
		t_put32(h + 64, sluice_crc32c(0, b + schema, shards + 16 * nshards - schema));
		t_put32(h + 68, sluice_crc32c(0, h, 68));
		T_CHECK(pwrite(fd, h, 72, 0) == 72);
		free(b);
	}
	close(fd);
	T_CHECK(sluice_dataset_open(&ds, p) == 0);
	T_CHECK(sluice_dataset_read(ds, 5000, buf, sizeof(buf), NULL) > 0);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
	read_ds(p, 9000, 7);
}

/* A shard name held by a FIFO in the output directory is refused, named, and left as it was (not renamed over). */
static void t_writer_special_target(void)
{
	struct sluice_writer *w = NULL;
	char p[700], shard[800];
	struct stat st;
	int rc;

	snprintf(p, sizeof(p), "%s/fifo-out", dir);
	snprintf(shard, sizeof(shard), "%s/shard-000000.sls", p);
	T_CHECK(mkdir(p, 0755) == 0 && mkfifo(shard, 0600) == 0);
	rc = sluice_writer_open(&w, p, fields, 3, NULL);
	if (rc == 0)
		rc = sluice_writer_close(w);
	T_CHECK(rc == -EINVAL);
	T_CHECK(strstr(sluice_last_error_detail(), shard) && strstr(sluice_last_error_detail(), "not a regular file"));
	T_CHECK(lstat(shard, &st) == 0 && S_ISFIFO(st.st_mode));
}

int main(void)
{
	dir = t_dir("t_format");
	t_crc();
	t_roundtrip(3000);
	t_zstd();
	t_big_records();
	t_corruption();
	t_index_entries();
	t_writer_errors();
	t_writer_special_target();
	test_a_record_of_one_empty_field();
	return t_done("t_format");
}
