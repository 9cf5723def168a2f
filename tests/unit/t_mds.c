/*
 * MDS datasets (MosaicML Streaming) in place, under ASan+UBSan: an
 * index.json and a shard written here as Streaming lays them out open and
 * read back; a shard whose offsets run past the file or backwards, a count
 * that differs from the index's, a name that leaves the directory, and a
 * sample whose column sizes run past it are refused, naming what is wrong.
 * The same for LitData's chunks (the same shard layout, every leaf's size
 * in the sample): a chunk reads back; nested samples and compressed chunks
 * are refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	return t_done("t_mds");
}
