/*
 * Reader of TFRecord files (TensorFlow's record format), in place.  A file
 * is records one after another, each a little-endian u64 length, the masked
 * CRC32C of those 8 bytes, the data, and the masked CRC32C of the data.
 * Opening a dataset walks each file's record headers once, checking every
 * length against its CRC and against the file's end, into a table of where
 * each record's data lies; a record's data CRC, unmasked, is its CRC32C,
 * which the engine checks as it reads the record, as for sluice's own
 * shards.  One field, "record": the record's bytes (a serialized
 * tf.train.Example, usually; sluice.tf_example decodes one).  A dataset is a
 * .tfrecord file (also .tfrecords, .tfr) or a directory of them, on any
 * store; compressed files (.gz, .zlib) are refused by name, and one under
 * a plain name by what its first bytes say (gzip, zlib).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "format/format.h"

#define SL_TFR_MASK 0xa282ead8u

struct sl_tfr {
	struct sl__tfr_rec *rec; /* every file's records, file after file */
	uint64_t *first;         /* first[f]: the index of file f's first record; first[nfiles]: the count */
};

uint32_t sl__tfr_unmask(uint32_t masked)
{
	uint32_t rot = masked - SL_TFR_MASK;

	return rot >> 17 | rot << 15;
}

static int sl_ends(const char *path, const char *const *suffixes)
{
	for (const char *const *s = suffixes; *s; s++)
		if (sl__ends_with(path, *s))
			return 1;
	return 0;
}

static const char *const sl_tfr_compressed[] = { ".gz", ".zlib", ".GZIP", ".ZLIB", NULL };

static int sl_tfr_refuse_compressed(const char *path)
{
	return sl__err(SLUICE_EFORMAT, "%s: a compressed TFRecord file; sluice reads uncompressed ones", path);
}

/* A TFRecord file's name, compressed (".tfrecord.gz": then refused by name at open) or not. */
static int sl_tfr_name(const char *path)
{
	static const char *const names[] = { ".tfrecord", ".tfrecords", ".tfr", NULL };
	char stem[4096];

	/* A URL's query (a presigned one's) is not part of the name. */
	snprintf(stem, sizeof(stem), "%.*s", (int)(sl__fs_is_local(path) ? strlen(path) : strcspn(path, "?#")), path);
	for (const char *const *s = sl_tfr_compressed; *s; s++)
		if (sl__ends_with(stem, *s))
			stem[strlen(stem) - strlen(*s)] = 0;
	return sl_ends(stem, names);
}

/*
 * A file whose first length's CRC fails: gzip or zlib (TFRecordOptions'
 * GZIP and ZLIB) under a name that does not say so, named as that; else
 * not a TFRecord file.  Asked only once the CRC fails: an uncompressed
 * file's first record may be of a length whose bytes start 1f 8b.
 */
static int sl_tfr_bad_start(const unsigned char *p, const char *name)
{
	const char *z = p[0] == 0x1f && p[1] == 0x8b ? "gzip"
			: p[0] == 0x78 && ((unsigned)p[0] << 8 | p[1]) % 31 == 0 ? "zlib" : NULL;

	if (!z)
		return sl__err(SLUICE_EFORMAT, "%s: record 0: its length's CRC does not match (not a TFRecord file, or a "
			       "damaged one)", name);
	return sl__err(SLUICE_EFORMAT, "%s: compressed with %s (it starts %02x %02x), under a name that does not say "
		       "so; sluice reads uncompressed TFRecord files in place: decompress it first, or write it with "
		       "TFRecordOptions(compression_type=None)", name, z, p[0], p[1]);
}

int sl__tfr_scan(const unsigned char *p, size_t len, const char *name, struct sl__tfr_rec **out, uint64_t *n)
{
	size_t cap = 0, at = 0;

	*out = NULL;
	*n = 0;
	while (at < len) {
		uint64_t l;

		if (len - at < 12)
			return sl__err(SLUICE_EFORMAT, "%s: a record header cut short at offset %zu", name, at);
		l = sl__le64(p + at);
		if (SL_CRC_BAD(sl__tfr_unmask(sl__le32(p + at + 8)), sluice_crc32c(0, p + at, 8)))
			return at ? sl__err(SLUICE_EFORMAT, "%s: record %llu at offset %zu: its length's CRC does not match "
					    "(a damaged TFRecord file)", name, (unsigned long long)*n, at)
				  : sl_tfr_bad_start(p, name);
		if (l > UINT32_MAX || l + 4 > len - at - 12)
			return sl__err(SLUICE_EFORMAT, "%s: record %llu at offset %zu: %llu bytes %s", name,
				       (unsigned long long)*n, at, (unsigned long long)l,
				       l > UINT32_MAX ? "(sluice reads records under 4 GiB)" : "run past the file's end");
		if (sl__reserve(out, &cap, (size_t)(*n + 1) * sizeof(**out)))
			return -ENOMEM;
		(*out)[*n] = (struct sl__tfr_rec){ at + 12, (uint32_t)l, sl__tfr_unmask(sl__le32(p + at + 12 + l)) };
		(*n)++;
		at += 12 + (size_t)l + 4;
	}
	return 0;
}

static int sl_tfr_probe(const char *path)
{
	struct stat st;
	char **names;
	unsigned n;
	int ok = 0;

	if (sl_tfr_name(path))
		return 1;
	/* A directory that holds them. */
	if (sl__fs_stat(path, &st) || !S_ISDIR(st.st_mode) || sl__fs_list(path, 0, &names, &n))
		return 0;
	for (unsigned i = 0; i < n && !ok; i++)
		ok = sl_tfr_name(names[i]);
	sluice_list_free(names, n);
	return ok;
}

/* The files of path: itself, or the .tfrecord files directly in the directory it names (sorted). */
static int sl_tfr_files(const char *path, char ***files, unsigned *n)
{
	struct stat st;
	unsigned k = 0;
	int rc;

	if (sl_ends(path, sl_tfr_compressed))
		return sl_tfr_refuse_compressed(path);
	if (sl_tfr_name(path) || (sl__fs_stat(path, &st) == 0 && !S_ISDIR(st.st_mode))) {
		*files = calloc(1, sizeof(char *));
		if (!*files || !((*files)[0] = strdup(path)))
			return -ENOMEM;
		*n = 1;
		return 0;
	}
	if ((rc = sl__fs_list(path, 0, files, n)))
		return rc;
	for (unsigned i = 0; i < *n; i++) {
		char *f = (*files)[i];

		if (!rc && sl_tfr_name(f) && sl_ends(f, sl_tfr_compressed))
			rc = sl_tfr_refuse_compressed(f);
		if (!rc && sl_tfr_name(f))
			(*files)[k++] = f;
		else
			free(f);
	}
	*n = k;
	if (rc) {
		sluice_list_free(*files, k);
		*files = NULL;
		*n = 0;
		return rc;
	}
	return k ? 0 : sl__err(-ENOENT, "%s: no .tfrecord files in it", path);
}

/* File f's records appended to t's table (mapped through the dataset, so pinned to the version it reads). */
static int sl_tfr_load(struct sluice_dataset *ds, struct sl_tfr *t, unsigned f, size_t *cap)
{
	const unsigned char *map;
	struct sl__tfr_rec *r = NULL;
	size_t len;
	uint64_t n = 0, have = t->first[f];
	int rc = sl__ds_map(ds, f, &map, &len);

	if (rc == SLUICE_EFORMAT && !map) /* an empty file: no records */
		sl__err_clear(), rc = 0;
	if (!rc && map)
		rc = sl__tfr_scan(map, len, ds->files[f], &r, &n);
	if (map)
		munmap((void *)map, len);
	if (!rc && sl__reserve(&t->rec, cap, (size_t)(have + n + 1) * sizeof(*r)))
		rc = -ENOMEM;
	if (!rc) {
		if (n)
			memcpy(t->rec + have, r, (size_t)n * sizeof(*r));
		t->first[f + 1] = have + n;
		ds->file_bytes[f] = len;
		ds->file_records[f] = n;
	}
	free(r);
	return rc;
}

static int sl_tfr_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_tfr *t = calloc(1, sizeof(*t));
	char **files = NULL;
	unsigned n = 0;
	size_t cap = 0;
	int rc = t ? sl_tfr_files(path, &files, &n) : -ENOMEM;

	ds->priv = t;
	if (rc) {
		sluice_list_free(files, n);
		return rc;
	}
	if ((rc = sl__ds_files(ds, files, n)))
		return rc;
	t->first = calloc((size_t)n + 1, sizeof(uint64_t));
	ds->file_records = calloc(n ? n : 1, sizeof(uint64_t));
	if (!t->first || !ds->file_records)
		return -ENOMEM;
	for (unsigned f = 0; !rc && f < n; f++) {
		t->first[f + 1] = t->first[f];
		rc = sl_tfr_load(ds, t, f, &cap);
	}
	if (rc)
		return rc;
	ds->nrecords = t->first[n];
	ds->nfields = 1;
	snprintf(ds->names[0], sizeof(ds->names[0]), "record");
	ds->fields[0] = (struct sluice_field){ ds->names[0], SLUICE_DTYPE_BYTES, 0, { 0 } };
	ds->has_crc = 1;
	return 0;
}

static void sl_tfr_close(struct sluice_dataset *ds)
{
	struct sl_tfr *t = ds->priv;

	if (!t)
		return;
	free(t->rec);
	free(t->first);
	free(t);
}

static void sl_tfr_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_tfr *t = ds->priv;

	loc->shard = sl__ds_file_of(t->first, ds->nfiles, i);
	loc->offset = t->rec[i].off;
	loc->length = t->rec[i].len;
	loc->crc = t->rec[i].crc;
}

static int sl_tfr_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			 struct sluice_record *rec)
{
	(void)ds, (void)i;
	if (rec) {
		rec->data[0] = p;
		rec->len[0] = len;
	}
	return 0;
}

const struct sl__ds_ops sl__ds_tfrecord_ops = {
	.name = "tfrecord",
	.one_file = 1,
	.probe = sl_tfr_probe,
	.open = sl_tfr_open,
	.close = sl_tfr_close,
	.locate = sl_tfr_locate,
	.decode = sl_tfr_decode,
};
