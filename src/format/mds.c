/*
 * Reader of MosaicML Streaming's MDS datasets, in place: DIR/index.json
 * lists the shards (each its column names, encodings and fixed sizes, its
 * raw file's basename and sample count); a shard file is a u32 sample
 * count, u32 offsets (count + 1 of them, from the file's start), the
 * writer's config, then the samples.  A sample is the u32 sizes of its
 * variable-size columns, then every column's bytes in column order.
 * Opening checks every shard's offsets (rising, inside the file, past its
 * header) and its count against the index; a sample's sizes are checked
 * against its length as it is decoded.  Columns of a fixed-size number
 * encoding (int8..int64, uint8..uint32, float16..float64, "int", a static
 * "ndarray:DTYPE:SHAPE") are fields of that type; every other encoding
 * (str, bytes, jpeg, png, json, pkl, pil, a dynamic ndarray, ...) is the
 * column's encoded bytes, undecoded: a pickle is never loaded here.  MDS
 * carries no checksum of a sample; compressed shards (zip_data without
 * the raw file) are refused by name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <jansson.h>

#include "format/format.h"

#define SL_MDS_INDEX "index.json"
#define SL_MDS_INDEX_MAX (64u << 20)

struct sl_mds {
	uint32_t *off;          /* every shard's offsets, shard after shard (count + 1 each) */
	uint64_t *first;        /* first[s]: the index of shard s's first sample; first[nshards]: the count */
	uint64_t *at;           /* at[s]: where shard s's offsets start in off */
	unsigned ncols;
	uint32_t size[SLUICE_MAX_FIELDS]; /* a column's fixed size, 0: variable */
};

static const struct {
	const char *name;
	enum sluice_dtype dtype;
} sl_mds_numbers[] = {
	{ "int8", SLUICE_DTYPE_I8 },	 { "int16", SLUICE_DTYPE_I16 },	  { "int32", SLUICE_DTYPE_I32 },
	{ "int64", SLUICE_DTYPE_I64 },	 { "int", SLUICE_DTYPE_I64 },	  { "uint8", SLUICE_DTYPE_U8 },
	{ "uint16", SLUICE_DTYPE_U16 },	 { "uint32", SLUICE_DTYPE_U32 },  { "float16", SLUICE_DTYPE_F16 },
	{ "float32", SLUICE_DTYPE_F32 }, { "float64", SLUICE_DTYPE_F64 },
};

static int sl_mds_dtype(const char *name, enum sluice_dtype *out)
{
	for (size_t i = 0; i < sizeof(sl_mds_numbers) / sizeof(sl_mds_numbers[0]); i++)
		if (!strcmp(name, sl_mds_numbers[i].name)) {
			*out = sl_mds_numbers[i].dtype;
			return 1;
		}
	return 0;
}

/* The field column c of shard object sh describes; SLUICE_EFORMAT naming what does not fit. */
static int sl_mds_column(struct sluice_dataset *ds, struct sl_mds *m, unsigned c, const char *name, const char *enc,
			 json_t *size, const char *where)
{
	enum sluice_dtype dt = SLUICE_DTYPE_BYTES;
	struct sluice_field *f = &ds->fields[c];
	char type[32];
	int64_t shape[SLUICE_MAX_NDIM];
	int ndim = 0, n = 0;
	uint64_t want;

	snprintf(ds->names[c], sizeof(ds->names[c]), "%s", name);
	*f = (struct sluice_field){ ds->names[c], SLUICE_DTYPE_BYTES, 0, { 0 } };
	m->size[c] = json_is_integer(size) && json_integer_value(size) > 0 && json_integer_value(size) <= UINT32_MAX
			     ? (uint32_t)json_integer_value(size) : 0;
	if (!json_is_null(size) && !m->size[c])
		return sl__err(SLUICE_EFORMAT, "%s: column '%s': a size that is not a positive u32", where, name);
	/* "ndarray:DTYPE:D1,D2,..." of a static shape: a typed field of that shape. */
	if (sscanf(enc, "ndarray:%31[^:]:%n", type, &n) == 1 && n && sl_mds_dtype(type, &dt)) {
		for (const char *p = enc + n; *p && ndim < SLUICE_MAX_NDIM; ndim++) {
			char *end;
			long long d = strtoll(p, &end, 10);

			if (end == p || d <= 0 || d > (1ll << 40) || (*end && *end != ','))
				return sl__err(SLUICE_EFORMAT, "%s: column '%s': encoding '%s'", where, name, enc);
			shape[ndim] = d;
			p = *end ? end + 1 : end;
		}
		want = sluice_dtype_size(dt);
		for (int d = 0; d < ndim; d++)
			want *= (uint64_t)shape[d];
		if (!ndim || want != m->size[c])
			return sl__err(SLUICE_EFORMAT, "%s: column '%s': encoding '%s' but size %u", where, name, enc,
				       m->size[c]);
		*f = (struct sluice_field){ ds->names[c], dt, ndim, { 0 } };
		memcpy(f->shape, shape, (size_t)ndim * sizeof(int64_t));
		return 0;
	}
	if (sl_mds_dtype(enc, &dt)) {
		if (m->size[c] != sluice_dtype_size(dt))
			return sl__err(SLUICE_EFORMAT, "%s: column '%s': encoding %s of size %u", where, name, enc, m->size[c]);
		*f = (struct sluice_field){ ds->names[c], dt, 0, { 0 } };
		return 0;
	}
	if (!strcmp(enc, "uint64"))
		return sl__err(SLUICE_EFORMAT, "%s: column '%s': uint64, which sluice has no type for", where, name);
	return 0; /* its encoded bytes */
}

/* The columns of the first shard; every other shard's must be the same. */
static int sl_mds_columns(struct sluice_dataset *ds, struct sl_mds *m, json_t *sh, json_t *first, const char *where)
{
	json_t *names = json_object_get(sh, "column_names"), *encs = json_object_get(sh, "column_encodings");
	json_t *sizes = json_object_get(sh, "column_sizes");
	size_t n = json_array_size(names);
	int rc = 0;

	if (first)
		return json_equal(names, json_object_get(first, "column_names")) &&
		       json_equal(encs, json_object_get(first, "column_encodings")) &&
		       json_equal(sizes, json_object_get(first, "column_sizes"))
			       ? 0 : sl__err(SLUICE_EFORMAT, "%s: its shards' columns differ", where);
	if (!n || n > SLUICE_MAX_FIELDS || json_array_size(encs) != n || json_array_size(sizes) != n)
		return sl__err(SLUICE_EFORMAT, "%s: a shard's column names, encodings and sizes (1 to %u of each, as "
			       "many of each)", where, SLUICE_MAX_FIELDS);
	for (size_t c = 0; !rc && c < n; c++) {
		const char *name = json_string_value(json_array_get(names, c));
		const char *enc = json_string_value(json_array_get(encs, c));

		if (!name || !enc || !*name || strlen(name) >= sizeof(ds->names[0]))
			rc = sl__err(SLUICE_EFORMAT, "%s: column %zu: its name and encoding", where, c);
		else
			rc = sl_mds_column(ds, m, (unsigned)c, name, enc, json_array_get(sizes, c), where);
	}
	ds->nfields = m->ncols = (unsigned)n;
	return rc ? rc : sl__schema_check(ds->fields, ds->nfields);
}

/* Shard s's header: its count against the index's, its offsets rising and inside the file, copied. */
static int sl_mds_shard(struct sluice_dataset *ds, struct sl_mds *m, unsigned s, uint64_t samples, size_t *cap)
{
	const unsigned char *p;
	size_t len;
	uint64_t n, base = m->at[s];
	int rc = sl__ds_map(ds, s, &p, &len);

	if (rc)
		return rc;
	n = len >= 4 ? sl__le32(p) : UINT64_MAX;
	if (n != samples || (n + 2) * 4 > len)
		rc = sl__err(SLUICE_EFORMAT, "%s: %llu samples in the file, %llu in index.json (or its offsets cut short)",
			     ds->files[s], (unsigned long long)(n == UINT64_MAX ? 0 : n), (unsigned long long)samples);
	if (!rc && sl__reserve(&m->off, cap, (size_t)(base + n + 1) * sizeof(uint32_t)))
		rc = -ENOMEM;
	for (uint64_t i = 0; !rc && i <= n; i++) {
		uint32_t o = sl__le32(p + 4 + 4 * i);

		if (o < (n + 2) * 4 || o > len || (i && o < m->off[base + i - 1]))
			rc = sl__err(SLUICE_EFORMAT, "%s: sample %llu's offset %u out of order or outside the file", ds->files[s],
				     (unsigned long long)(i ? i - 1 : 0), o);
		else
			m->off[base + i] = o;
	}
	munmap((void *)p, len);
	if (!rc) {
		m->at[s + 1] = base + n + 1;
		m->first[s + 1] = m->first[s] + n;
		ds->file_bytes[s] = len;
		ds->file_records[s] = n;
	}
	return rc;
}

static json_t *sl_mds_index(const char *dir, char **where)
{
	const unsigned char *map;
	size_t len;
	json_t *j = NULL;

	if (asprintf(where, "%s/%s", dir, SL_MDS_INDEX) < 0)
		return *where = NULL, NULL;
	if (sl__map_ro(*where, &map, &len, 0))
		return NULL;
	if (len <= SL_MDS_INDEX_MAX)
		j = json_loadb((const char *)map, len, JSON_REJECT_DUPLICATES, NULL);
	munmap((void *)map, len);
	if (!j || !json_is_object(j) || !json_is_array(json_object_get(j, "shards"))) {
		json_decref(j);
		sl__err(SLUICE_EFORMAT, "%s: not MDS's index (a JSON object with \"shards\", at most %u bytes)", *where,
			SL_MDS_INDEX_MAX);
		return NULL;
	}
	return j;
}

/* Owns a directory whose index.json's first shard says "format": "mds". */
static int sl_mds_probe(const char *path)
{
	char *where = NULL, *p = NULL;
	struct stat st;
	json_t *j = NULL;
	int ok = 0;

	if (asprintf(&p, "%s/%s", path, SL_MDS_INDEX) >= 0 && sl__fs_stat(p, &st) == 0 && S_ISREG(st.st_mode) &&
	    (j = sl_mds_index(path, &where)))
		ok = !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "shards"), 0), "format"))
				     ?: "", "mds");
	sl__err_clear();
	json_decref(j);
	free(where);
	free(p);
	return ok;
}

/* The shard file a shard object names: DIR/basename, one plain name (never a path out of the directory). */
static int sl_mds_file(json_t *sh, const char *dir, const char *where, char **out, uint64_t *samples)
{
	const char *b = json_string_value(json_object_get(json_object_get(sh, "raw_data"), "basename"));
	json_t *n = json_object_get(sh, "samples");

	if (!b && json_object_get(sh, "zip_data") && !json_is_null(json_object_get(sh, "zip_data")))
		return sl__err(SLUICE_EFORMAT, "%s: compressed shards; sluice reads MDS shards written without compression",
			       where);
	if (!b || !*b || strchr(b, '/') || strchr(b, '\\') || !strcmp(b, ".") || !strcmp(b, ".."))
		return sl__err(SLUICE_EFORMAT, "%s: a shard's raw_data basename %s%s%s is not a file of the directory", where,
			       b ? "'" : "", b ? b : "(none)", b ? "'" : "");
	if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > UINT32_MAX)
		return sl__err(SLUICE_EFORMAT, "%s: %s: its sample count", where, b);
	*samples = (uint64_t)json_integer_value(n);
	return asprintf(out, "%s/%s", dir, b) < 0 ? -ENOMEM : 0;
}

static int sl_mds_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_mds *m = calloc(1, sizeof(*m));
	char *where = NULL, **files = NULL;
	json_t *j = m ? sl_mds_index(path, &where) : NULL, *shards = json_object_get(j, "shards");
	size_t n = json_array_size(shards), cap = 0;
	uint64_t *samples = NULL;
	int rc = !m ? -ENOMEM : !j ? (where ? SLUICE_EFORMAT : -ENOMEM) : 0;

	ds->priv = m;
	if (!rc && (!n || n > SL_MAX_SHARDS))
		rc = sl__err(SLUICE_EFORMAT, "%s: %zu shards (1 to %u)", where, n, SL_MAX_SHARDS);
	if (!rc && (!(files = calloc(n, sizeof(char *))) || !(samples = calloc(n, sizeof(uint64_t)))))
		rc = -ENOMEM;
	for (size_t s = 0; !rc && s < n; s++) {
		json_t *sh = json_array_get(shards, s);

		if (strcmp(json_string_value(json_object_get(sh, "format")) ?: "", "mds"))
			rc = sl__err(SLUICE_EFORMAT, "%s: shard %zu is not of format mds", where, s);
		else if (!(rc = sl_mds_columns(ds, m, sh, s ? json_array_get(shards, 0) : NULL, where)))
			rc = sl_mds_file(sh, path, where, &files[s], &samples[s]);
	}
	if (!rc) {
		rc = sl__ds_files(ds, files, (unsigned)n);
		files = NULL;
	}
	if (!rc && (!(m->first = calloc(n + 1, sizeof(uint64_t))) || !(m->at = calloc(n + 1, sizeof(uint64_t))) ||
		    !(ds->file_records = calloc(n, sizeof(uint64_t)))))
		rc = -ENOMEM;
	for (unsigned s = 0; !rc && s < n; s++)
		rc = sl_mds_shard(ds, m, s, samples[s], &cap);
	if (!rc) {
		ds->nrecords = m->first[n];
		ds->has_crc = 0;
	}
	if (files)
		sluice_list_free(files, (unsigned)n);
	free(samples);
	json_decref(j);
	free(where);
	return rc;
}

static void sl_mds_close(struct sluice_dataset *ds)
{
	struct sl_mds *m = ds->priv;

	if (!m)
		return;
	free(m->off);
	free(m->first);
	free(m->at);
	free(m);
}

static void sl_mds_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_mds *m = ds->priv;
	unsigned s = sl__ds_file_of(m->first, ds->nfiles, i);
	uint64_t k = m->at[s] + (i - m->first[s]);

	loc->shard = s;
	loc->offset = m->off[k];
	loc->length = m->off[k + 1] - m->off[k];
	loc->crc = 0;
}

static int sl_mds_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			 struct sluice_record *rec)
{
	const struct sl_mds *m = ds->priv;
	size_t at = 0, var = 0;

	for (unsigned c = 0; c < m->ncols; c++)
		var += !m->size[c];
	if (var * 4 > len)
		return sl__err(SLUICE_EFORMAT, "sample %llu: %zu bytes cannot hold its %zu sizes", (unsigned long long)i,
			       len, var);
	at = var * 4;
	for (unsigned c = 0, v = 0; c < m->ncols; c++) {
		size_t size = m->size[c] ? m->size[c] : sl__le32(p + 4 * v++);

		if (size > len - at)
			return sl__err(SLUICE_EFORMAT, "sample %llu: column '%s' of %zu bytes runs past its %zu",
				       (unsigned long long)i, ds->fields[c].name, size, len);
		if (rec) {
			rec->data[c] = p + at;
			rec->len[c] = size;
		}
		at += size;
	}
	return at == len ? 0 : sl__err(SLUICE_EFORMAT, "sample %llu: %zu bytes left over after its columns",
				       (unsigned long long)i, len - at);
}

const struct sl__ds_ops sl__ds_mds_ops = {
	.name = "mds",
	.probe = sl_mds_probe,
	.open = sl_mds_open,
	.close = sl_mds_close,
	.locate = sl_mds_locate,
	.decode = sl_mds_decode,
};
