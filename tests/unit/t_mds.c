/*
 * MDS datasets (MosaicML Streaming) in place, under ASan+UBSan: an
 * index.json and a shard written here as Streaming lays them out open and
 * read back; a shard whose offsets run past the file or backwards, a count
 * that differs from the index's, a name that leaves the directory, and a
 * sample whose column sizes run past it are refused, naming what is wrong.
 * The same for LitData's chunks (the same shard layout, every leaf's size
 * in the sample): a chunk reads back; nested samples and compressed chunks
 * are refused.  LitData's Arrow row footers (an IPC file pyarrow wrote, in
 * tests/fuzz): read whole, and cut at every length or with any byte of
 * its first 4 KiB flipped, refused or read inside its bytes, never past.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "t_util.h"

static char dir[700];

/* Two samples of columns text (str) and n (int64, fixed 8), count given; harm: 1 offsets past the end, 2 a size past its sample. */
static void write_ds(const char *basename, unsigned count, int harm)
{
	char p[800];
	FILE *f;
	uint32_t head[4] = { 2, 0, 0, 0 }, size[2] = { 3, 5 };
	int64_t n[2] = { 7, -9 };
	const char *text[2] = { "abc", "hello" };

	snprintf(p, sizeof(p), "%s/index.json", dir);
	f = fopen(p, "w");
	fprintf(f, "{\"version\": 2, \"shards\": [{\"column_encodings\": [\"str\", \"int\"], \"column_names\": [\"text\", "
		"\"n\"], \"column_sizes\": [null, 8], \"compression\": null, \"format\": \"mds\", \"hashes\": [], "
		"\"raw_data\": {\"basename\": \"%s\", \"bytes\": 0, \"hashes\": {}}, \"samples\": %u, \"version\": 2, "
		"\"zip_data\": null}]}", basename, count);
	fclose(f);
	head[1] = 16;
	head[2] = head[1] + 4 + 3 + 8;
	head[3] = harm == 1 ? 1000 : head[2] + 4 + 5 + 8;
	if (harm == 2)
		size[0] = 300;
	snprintf(p, sizeof(p), "%s/shard.00000.mds", dir);
	f = fopen(p, "wb");
	fwrite(head, 4, 4, f);
	for (int i = 0; i < 2; i++) {
		fwrite(&size[i], 4, 1, f);
		fwrite(text[i], 1, strlen(text[i]), f);
		fwrite(&n[i], 8, 1, f);
	}
	fclose(f);
}

/* LitData: one chunk of two samples of leaves text (str) and n (int); harm: 1 nested, 2 compressed. */
static void write_ld(int harm)
{
	const char *leaf = "{\\\"type\\\": null, \\\"context\\\": null, \\\"children_spec\\\": []}";
	char p[800];
	FILE *f;
	uint32_t head[4] = { 2, 16, 16 + 8 + 2 + 8, 16 + 8 + 2 + 8 + 8 + 3 + 8 }, size[2][2] = { { 2, 8 }, { 3, 8 } };
	int64_t n[2] = { 1, 2 };
	const char *text[2] = { "hi", "you" };

	snprintf(p, sizeof(p), "%s/index.json", dir);
	f = fopen(p, "w");
	fprintf(f, "{\"chunks\": [{\"chunk_bytes\": 0, \"chunk_size\": 2, \"dim\": null, \"filename\": \"c.bin\"}], "
		"\"config\": {\"compression\": %s, \"encryption\": null, \"item_loader\": \"PyTreeLoader\", "
		"\"data_format\": [\"str\", \"int\"], \"data_spec\": \"[1, {\\\"type\\\": \\\"builtins.dict\\\", "
		"\\\"context\\\": \\\"[\\\\\\\"text\\\\\\\", \\\\\\\"n\\\\\\\"]\\\", \\\"children_spec\\\": [%s, %s]}]\"}}",
		harm == 2 ? "\"zstd\"" : "null", leaf,
		harm == 1 ? "{\\\"type\\\": \\\"builtins.list\\\", \\\"context\\\": null, \\\"children_spec\\\": []}" : leaf);
	fclose(f);
	snprintf(p, sizeof(p), "%s/c.bin", dir);
	f = fopen(p, "wb");
	fwrite(head, 4, 4, f);
	for (int i = 0; i < 2; i++) {
		fwrite(size[i], 4, 2, f);
		fwrite(text[i], 1, strlen(text[i]), f);
		fwrite(&n[i], 8, 1, f);
	}
	fclose(f);
}

/* Every batch's rows laid out, as a dataset reads them: 0, or the first error. */
static int t_arrow_rows(const struct sl__arrow *a, const unsigned char *p)
{
	int rc = 0;

	for (uint64_t k = 0; !rc && k < a->nbatches; k++) {
		uint64_t *off = calloc(a->b[k].rows + 1, sizeof(uint64_t));
		unsigned char *dst = NULL;

		rc = off ? sl__arrow_rows_len(a, k, p + a->b[k].body, off, "t") : -1;
		if (!rc && !(dst = malloc(off[a->b[k].rows] + 1)))
			rc = -1;
		if (!rc)
			rc = sl__arrow_rows(a, k, p + a->b[k].body, off, dst, "t");
		free(dst);
		free(off);
	}
	return rc;
}

static void t_arrow(void)
{
	char path[4096];
	size_t n = 0;
	unsigned char *p, *q;
	struct sl__arrow a;

	snprintf(path, sizeof(path), "%s/../fuzz/corpus_format/arrow-ipc-file", T_SRC_DIR);
	p = (unsigned char *)t_slurp(path, &n);
	T_CHECK(p && n > 64);
	if (!p)
		return;
	T_CHECK(sl__arrow_parse(p, n, 0, &a, "t") == 0 && a.rows == 300 && a.ncols == 5 && a.nbatches == 2);
	T_CHECK(a.col[0].kind == SL_ACOL_VAR32 && a.col[1].dtype == SLUICE_DTYPE_I64 && a.col[3].kind == SL_ACOL_BOOL);
	T_CHECK(t_arrow_rows(&a, p) == 0);
	sl__arrow_free(&a);
	/* Cut anywhere: each prefix in a buffer of its own size, so ASan sees any read past it. */
	for (size_t k = 0; k < n; k += k < 2048 ? 1 : 97) {
		q = malloc(k ? k : 1);
		memcpy(q, p, k);
		if (sl__arrow_parse(q, k, 0, &a, "t") == 0) {
			(void)t_arrow_rows(&a, q);
			sl__arrow_free(&a);
		}
		free(q);
	}
	/* Any byte of its head flipped: refused, or read inside the bytes. */
	q = malloc(n);
	for (size_t k = 0; q && k < n && k < 4096; k++)
		for (int bit = 0; bit < 8; bit += 3) {
			memcpy(q, p, n);
			q[k] ^= (unsigned char)(1u << bit);
			if (sl__arrow_parse(q, n, 0, &a, "t") == 0) {
				(void)t_arrow_rows(&a, q);
				sl__arrow_free(&a);
			}
		}
	free(q);
	/* A message length of 2 GiB: refused by name, nothing allocated for it. */
	q = malloc(n);
	memcpy(q, p, n);
	sl__put32(q + 12, 0x7fffffffu);
	T_CHECK(sl__arrow_parse(q, n, 0, &a, "t") == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "runs past"));
	free(q);
	free(p);
}

int main(void)
{
	struct sluice_dataset *ds = NULL;
	char buf[64];
	struct sluice_record rec;
	int64_t v = 0;

	snprintf(dir, sizeof(dir), "%s", t_dir("t_mds"));
	write_ds("shard.00000.mds", 2, 0);
	T_CHECK(sluice_dataset_open(&ds, dir) == 0);
	T_CHECK(ds && !strcmp(sluice_dataset_format(ds), "mds") && sluice_dataset_count(ds) == 2);
	T_CHECK(ds && sluice_dataset_read(ds, 1, buf, sizeof(buf), &rec) > 0 && rec.len[0] == 5 &&
		!memcmp(rec.data[0], "hello", 5) && rec.len[1] == 8);
	memcpy(&v, rec.data[1], 8); /* a sample's columns are packed: not aligned */
	T_CHECK(v == -9);
	sluice_dataset_close(ds);
	write_ds("shard.00000.mds", 3, 0);
	T_CHECK(sluice_dataset_open(&ds, dir) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "in index.json"));
	write_ds("../shard.00000.mds", 2, 0);
	T_CHECK(sluice_dataset_open(&ds, dir) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "not a file of"));
	write_ds("shard.00000.mds", 2, 1);
	T_CHECK(sluice_dataset_open(&ds, dir) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "outside the file"));
	write_ds("shard.00000.mds", 2, 2);
	T_CHECK(sluice_dataset_open(&ds, dir) == 0);
	T_CHECK(ds && sluice_dataset_read(ds, 0, buf, sizeof(buf), &rec) == SLUICE_EFORMAT &&
		strstr(sluice_last_error_detail(), "run past"));
	sluice_dataset_close(ds);
	write_ld(0);
	T_CHECK(sluice_dataset_open(&ds, dir) == 0);
	T_CHECK(ds && !strcmp(sluice_dataset_format(ds), "litdata") && sluice_dataset_count(ds) == 2);
	T_CHECK(ds && sluice_dataset_read(ds, 1, buf, sizeof(buf), &rec) > 0 && rec.len[0] == 3 &&
		!memcmp(rec.data[0], "you", 3) && rec.len[1] == 8);
	memcpy(&v, rec.data[1], 8);
	T_CHECK(v == 2);
	sluice_dataset_close(ds);
	write_ld(1);
	T_CHECK(sluice_dataset_open(&ds, dir) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "nested"));
	write_ld(2);
	T_CHECK(sluice_dataset_open(&ds, dir) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "compressed"));
	t_arrow();
	return t_done("t_mds");
}
