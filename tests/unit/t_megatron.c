/*
 * Megatron indexed datasets read in place: a .bin/.idx pair written here
 * exactly as Megatron-LM's MMapIndexedDatasetBuilder lays it out (see
 * docs/FORMAT.md) opens by prefix, .idx or .bin; every sequence reads back;
 * damaged indexes and out-of-range pointers are named, never read.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "t_util.h"

static char prefix[600];

/* Sequence i has (i * 37) % 100 + 1 u16 tokens; documents of 3 sequences. */
static void write_megatron(uint64_t nseq, int modes)
{
	char p[700];
	FILE *bin, *idx;
	int64_t ptr = 0;
	uint64_t ndoc = (nseq + 2) / 3 + 1;

	snprintf(p, sizeof(p), "%s.bin", prefix);
	bin = fopen(p, "wb");
	snprintf(p, sizeof(p), "%s.idx", prefix);
	idx = fopen(p, "wb");
	fwrite("MMIDIDX\0\0", 1, 9, idx);
	uint64_t ver = 1;
	uint8_t code = 8; /* u16 */

	fwrite(&ver, 8, 1, idx);
	fwrite(&code, 1, 1, idx);
	fwrite(&nseq, 8, 1, idx);
	fwrite(&ndoc, 8, 1, idx);
	for (uint64_t i = 0; i < nseq; i++) {
		int32_t len = (int32_t)((i * 37) % 100 + 1);

		fwrite(&len, 4, 1, idx);
		for (int32_t k = 0; k < len; k++) {
			uint16_t t = (uint16_t)(i * 1000 + (uint64_t)k);

			fwrite(&t, 2, 1, bin);
		}
	}
	for (uint64_t i = 0; i < nseq; i++) {
		fwrite(&ptr, 8, 1, idx);
		ptr += (int64_t)(((i * 37) % 100 + 1) * 2);
	}
	for (uint64_t d = 0; d < ndoc; d++) {
		int64_t v = (int64_t)(d * 3 < nseq ? d * 3 : nseq);

		fwrite(&v, 8, 1, idx);
	}
	for (uint64_t i = 0; modes && i < nseq; i++)
		fputc(0, idx);
	fclose(bin);
	fclose(idx);
}

static void t_read(uint64_t nseq, const char *open_as)
{
	struct sluice_dataset *ds;
	struct sluice_record rec;
	uint16_t buf[128];

	T_CHECK(sluice_dataset_open(&ds, open_as) == 0);
	if (!ds)
		return;
	T_CHECK(!strcmp(sluice_dataset_format(ds), "megatron"));
	T_CHECK(sluice_dataset_count(ds) == nseq && sluice_dataset_nfields(ds) == 1);
	T_CHECK(!strcmp(sluice_dataset_field(ds, 0)->name, "tokens") && sluice_dataset_field(ds, 0)->dtype == SLUICE_DTYPE_U16);
	for (uint64_t i = 0; i < nseq; i++) {
		size_t len = (i * 37) % 100 + 1;
		int ok = 1;

		T_CHECK(sluice_dataset_read(ds, i, buf, sizeof(buf), &rec) == (ssize_t)(2 * len));
		T_CHECK(rec.len[0] == 2 * len);
		for (size_t k = 0; k < len; k++)
			ok &= ((const uint16_t *)rec.data[0])[k] == (uint16_t)(i * 1000 + k);
		T_CHECK(ok);
	}
	T_CHECK(sluice_dataset_read(ds, nseq, buf, sizeof(buf), &rec) == SLUICE_ERANGE);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
}

static void patch(const char *suffix, long off, const void *v, size_t n)
{
	char p[700];
	int fd;

	snprintf(p, sizeof(p), "%s%s", prefix, suffix);
	fd = open(p, O_RDWR);
	T_CHECK(fd >= 0 && pwrite(fd, v, n, off) == (ssize_t)n);
	close(fd);
}

/*
 * A batch's offsets count the tokens of its data, as cu_seqlens does: record
 * j is ((uint16_t *)data)[offsets[j], offsets[j + 1]), equal to its sequence.
 */
static void test_loader_offsets_count_tokens(struct sluice_dataset *ds)
{
	struct sluice_engine *eng = t_engine();
	struct sluice_loader_options o = { .size = sizeof(o), .batch_size = 9, .seed = 5, .shuffle = 1 };
	struct sluice_loader *ld = NULL;
	struct sluice_batch b = SLUICE_BATCH_INIT;
	uint64_t batches = 0;
	int rc = -1;

	T_CHECK(sluice_loader_open(&ld, eng, ds, &o) == 0);
	while (ld && (rc = sluice_loader_next(ld, &b, NULL)) == 1) {
		const struct sluice_batch_field *f = &b.field[0];
		const uint16_t *tok = f->data;

		T_CHECK(f->dtype == SLUICE_DTYPE_U16 && f->offsets[0] == 0);
		for (uint32_t j = 0; j < b.size; j++) {
			uint64_t i = b.ids[j], n = (i * 37) % 100 + 1;

			T_CHECK(f->offsets[j + 1] - f->offsets[j] == n);
			for (uint64_t k = 0; k < n && f->offsets[j] + k < f->offsets[b.size]; k++)
				T_CHECK(tok[f->offsets[j] + k] == (uint16_t)(i * 1000 + k));
		}
		batches++;
	}
	T_CHECK(rc == 0 && batches == sluice_loader_batches(ld));
	sluice_loader_close(ld);
	sluice_engine_close(eng);
}

/*
 * The .idx changed in place after the open (Megatron's builder rewrites it
 * with open(..., "wb"): a length patched, then the file cut to 10 bytes):
 * every sequence still reads as the open saw it (a mapped .idx gave the
 * patched length silently, zeros within its last page, SIGBUS past it).
 */
static void test_idx_changed_after_open(uint64_t n)
{
	struct sluice_dataset *ds;
	struct sluice_record rec;
	uint16_t buf[128];
	int32_t other = 2;
	char p[700];

	write_megatron(n, 0);
	T_CHECK(sluice_dataset_open(&ds, prefix) == 0);
	if (!ds)
		return;
	patch(".idx", 34 + 4 * 3, &other, 4);
	T_CHECK(sluice_dataset_read(ds, 3, buf, sizeof(buf), &rec) == (ssize_t)(2 * ((3 * 37) % 100 + 1)));
	snprintf(p, sizeof(p), "%s.idx", prefix);
	T_CHECK(truncate(p, 10) == 0);
	for (uint64_t i = 0; i < n; i++) {
		size_t len = (i * 37) % 100 + 1;

		T_CHECK(sluice_dataset_read(ds, i, buf, sizeof(buf), &rec) == (ssize_t)(2 * len));
		T_CHECK(rec.len[0] == 2 * len && ((const uint16_t *)rec.data[0])[len - 1] == (uint16_t)(i * 1000 + len - 1));
	}
	sluice_dataset_close(ds);
}

int main(void)
{
	char p[700];
	struct sluice_dataset *ds;
	uint16_t buf[256];
	const uint64_t n = 500;

	snprintf(prefix, sizeof(prefix), "%s/corpus_text_document", t_dir("t_megatron"));
	write_megatron(n, 0);
	t_read(n, prefix);
	snprintf(p, sizeof(p), "%s.idx", prefix);
	t_read(n, p);
	snprintf(p, sizeof(p), "%s.bin", prefix);
	t_read(n, p);
	write_megatron(n, 1); /* with the optional modes array */
	t_read(n, prefix);
	/* Through the loader: shuffled batches of 7 from windows of about 30 sequences. */
	T_CHECK(sluice_dataset_open(&ds, prefix) == 0);
	t_loader_epoch(ds, 7, 3000);
	test_loader_offsets_count_tokens(ds);
	sluice_dataset_close(ds);

	test_idx_changed_after_open(n);
	write_megatron(n, 0);

	/* A pointer past the end of the .bin: a named error, and verify lists it. */
	int64_t far = 1ll << 40;

	patch(".idx", 34 + 4 * (long)n + 8 * 7, &far, 8);
	T_CHECK(sluice_dataset_open(&ds, prefix) == 0);
	T_CHECK(sluice_dataset_read(ds, 7, buf, sizeof(buf), NULL) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "record 7") != NULL);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 1);
	sluice_dataset_close(ds);
	/* A negative length. */
	write_megatron(n, 0);
	int32_t neg = -5;

	patch(".idx", 34 + 4 * 3, &neg, 4);
	T_CHECK(sluice_dataset_open(&ds, prefix) == 0);
	T_CHECK(sluice_dataset_read(ds, 3, buf, sizeof(buf), NULL) < 0);
	sluice_dataset_close(ds);
	/* Document indices out of order. */
	write_megatron(n, 0);
	int64_t d = 400;

	patch(".idx", 34 + 12 * (long)n + 8 * 2, &d, 8);
	T_CHECK(sluice_dataset_open(&ds, prefix) == 0);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) >= 1);
	sluice_dataset_close(ds);
	/* Header damage: magic, version, dtype, counts that do not fit, truncation. */
	write_megatron(n, 0);
	patch(".idx", 0, "X", 1);
	T_CHECK(sluice_dataset_open(&ds, prefix) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "magic"));
	write_megatron(n, 0);
	uint8_t code = 42;

	patch(".idx", 17, &code, 1);
	T_CHECK(sluice_dataset_open(&ds, prefix) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "dtype"));
	write_megatron(n, 0);
	uint64_t huge = 1ull << 62;

	patch(".idx", 18, &huge, 8);
	T_CHECK(sluice_dataset_open(&ds, prefix) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "cannot hold"));
	write_megatron(n, 0);
	snprintf(p, sizeof(p), "%s.idx", prefix);
	T_CHECK(truncate(p, 100) == 0);
	T_CHECK(sluice_dataset_open(&ds, prefix) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), ".idx"));
	/* A missing .bin. */
	write_megatron(n, 0);
	snprintf(p, sizeof(p), "%s.bin", prefix);
	unlink(p);
	T_CHECK(sluice_dataset_open(&ds, prefix) == -ENOENT && strstr(sluice_last_error_detail(), ".bin"));
	return t_done("t_megatron");
}
