/*
 * Readers of the two dataset formats of count-and-offsets shards, in
 * place: MosaicML Streaming's MDS and LitData's optimized chunks.
 *
 * MDS: DIR/index.json
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
 * carries no checksum of a sample.  A merged index (Streaming's
 * merge_index) names shards by paths below the directory ("0/shard.00000
 * .mds"); every name must stay below it, links followed.  A compressed
 * shard (zip_data, its raw file absent) of zstd, gz or bz2 is decompressed
 * once beside it under its raw name, as Streaming does with its local
 * copies, and read in place from there; br and snappy are refused naming
 * the codec.
 *
 * LitData (its PyTreeLoader's chunks): DIR/index.json's config gives every
 * sample's leaves' formats (data_format) and names (data_spec: a flat
 * dict's keys, or a tuple's positions), its chunks their files and item
 * counts; a chunk file is laid out as an MDS shard (no config), and a
 * sample is the u32 size of every leaf, then the leaves.  int, float and
 * bool are i64, f64 and u8; a 1-D numpy array or tensor without header
 * (no_header_numpy:K, no_header_tensor:K) is a variable-length array of
 * its dtype; everything else (str, bytes, pil, jpeg, pickle, ...) its
 * encoded bytes.  Compressed or encrypted chunks, and nested samples, are
 * refused by name.  LitData carries no checksum either.  A chunk whose
 * items are all empty keeps its samples in its Arrow row footer (LitData's
 * writer does so for a flat dict of strings and numbers): its table is
 * read in place (arrowipc.c), each record batch a block whose rows are
 * laid out as items are, so a dataset with such chunks reads its records
 * through blocks (ds->compressed), decoded from the chunk's bytes as read.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>

#include "format/format.h"

#define SL_MDS_INDEX "index.json"
#define SL_MDS_INDEX_MAX (64u << 20)

struct sl_mds {
	uint32_t *off;          /* every shard's offsets, shard after shard (count + 1 each) */
	uint64_t *first;        /* first[s]: the index of shard s's first sample; first[nshards]: the count */
	uint64_t *at;           /* at[s]: where shard s's offsets start in off */
	uint64_t *raw_bytes;    /* MDS: each shard's size as index.json gives it (0: not given) */
	struct sl__cols cols;
	/*
	 * LitData: the chunks whose samples are only in their Arrow footer
	 * (arrow[s] non-NULL); with any, ds->compressed, and every chunk's
	 * records are read through blocks[s] (an Arrow chunk's: one per record
	 * batch, its rows laid out as LitData's items; another's: runs of its
	 * items as they lie).  Single reads keep the last block decoded.
	 */
	int litdata;
	struct sl_ld_arrow **arrow;
	struct sl__block **blocks;
	uint64_t *nblocks;
	pthread_mutex_t lock;
	int have_lock;
	unsigned c_shard;
	uint64_t c_block;
	unsigned char *c_buf, *c_src;
	size_t c_cap, c_src_cap;
	int c_valid;
};

struct sl_ld_arrow {
	struct sl__arrow a;
	uint64_t *loff; /* rows + 1: each row's place in the chunk's records as laid out */
};

static int sl_ld_chunk(struct sluice_dataset *ds, struct sl_mds *m, unsigned s, const unsigned char *p, size_t len,
		       uint64_t n);

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
	m->cols.size[c] = json_is_integer(size) && json_integer_value(size) > 0 && json_integer_value(size) <= UINT32_MAX
			     ? (uint32_t)json_integer_value(size) : 0;
	if (!json_is_null(size) && !m->cols.size[c])
		return sl__err(SLUICE_EFORMAT, "%s: column '%s': a size that is not a positive u32", where, name);
	/* "ndarray:DTYPE:D1,D2,..." of a static shape: a typed field of that shape. */
	if (sscanf(enc, "ndarray:%31[^:]:%n", type, &n) == 1 && n && sl_mds_dtype(type, &dt)) {
		want = sluice_dtype_size(dt);
		for (const char *p = enc + n; *p; ndim++) {
			char *end;
			long long d = strtoll(p, &end, 10);

			if (end == p || d <= 0 || (*end && *end != ',') || ndim == SLUICE_MAX_NDIM ||
			    (uint64_t)d > UINT32_MAX / want)
				return sl__err(SLUICE_EFORMAT, "%s: column '%s': encoding '%s' (at most %d dimensions of at "
					       "most 4 GiB together)", where, name, enc, SLUICE_MAX_NDIM);
			want *= (uint64_t)d;
			shape[ndim] = d;
			p = *end ? end + 1 : end;
		}
		if (!ndim || want != m->cols.size[c])
			return sl__err(SLUICE_EFORMAT, "%s: column '%s': encoding '%s' but size %u", where, name, enc,
				       m->cols.size[c]);
		*f = (struct sluice_field){ ds->names[c], dt, ndim, { 0 } };
		memcpy(f->shape, shape, (size_t)ndim * sizeof(int64_t));
		return 0;
	}
	if (sl_mds_dtype(enc, &dt)) {
		if (m->cols.size[c] != sluice_dtype_size(dt))
			return sl__err(SLUICE_EFORMAT, "%s: column '%s': encoding %s of size %u", where, name, enc, m->cols.size[c]);
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
	ds->nfields = m->cols.n = (unsigned)n;
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
	n = len >= 4 ? sl__le32(p) : 0;
	if (m->raw_bytes && m->raw_bytes[s] && len != m->raw_bytes[s])
		rc = sl__err(SLUICE_EFORMAT, "%s: %zu bytes, index.json says %llu (another shard's file, or one cut short)",
			     ds->files[s], len, (unsigned long long)m->raw_bytes[s]);
	else if (len < 4 || n != samples)
		rc = sl__err(SLUICE_EFORMAT, "%s: %llu samples in the file, %llu in index.json", ds->files[s],
			     (unsigned long long)n, (unsigned long long)samples);
	if (!rc && sl__reserve(&m->off, cap, (size_t)(base + n + 1) * sizeof(uint32_t)))
		rc = -ENOMEM;
	if (!rc && (rc = sl__offsets_parse(p, len, m->off + base)))
		rc = sl__err(rc, "%s: %s", ds->files[s], sluice_last_error_detail());
	if (!rc) {
		m->at[s + 1] = base + n + 1;
		m->first[s + 1] = m->first[s] + n;
		ds->file_bytes[s] = len;
		ds->file_records[s] = n;
	}
	if (!rc && m->litdata)
		rc = sl_ld_chunk(ds, m, s, p, len, n);
	munmap((void *)p, len);
	return rc;
}

static json_t *sl_json_index(const char *dir, char **where, const char *key)
{
	const unsigned char *map;
	size_t len;
	json_t *j = NULL;

	struct stat st;

	if (asprintf(where, "%s/%s", dir, SL_MDS_INDEX) < 0)
		return *where = NULL, NULL;
	/* Its size asked first: a remote one over the bound is never fetched. */
	if (sl__fs_stat(*where, &st))
		return NULL;
	if ((uint64_t)st.st_size > SL_MDS_INDEX_MAX) {
		sl__err(SLUICE_EFORMAT, "%s: %lld bytes; sluice reads an index.json of at most %u", *where,
			(long long)st.st_size, SL_MDS_INDEX_MAX);
		return NULL;
	}
	if (sl__map_ro(*where, &map, &len, 0))
		return NULL;
	if (len <= SL_MDS_INDEX_MAX)
		j = json_loadb((const char *)map, len, JSON_REJECT_DUPLICATES, NULL);
	munmap((void *)map, len);
	if (!j || !json_is_object(j) || !json_is_array(json_object_get(j, key))) {
		json_decref(j);
		sl__err(SLUICE_EFORMAT, "%s: not the index sluice expects (a JSON object with \"%s\", at most %u bytes)",
			*where, key, SL_MDS_INDEX_MAX);
		return NULL;
	}
	return j;
}

/* The index.json of directory path, if it is one with an array under key (a probe: no error left). */
static json_t *sl_probe_index(const char *path, const char *key)
{
	char *where = NULL, *p = NULL;
	struct stat st;
	json_t *j = NULL;

	if (asprintf(&p, "%s/%s", path, SL_MDS_INDEX) >= 0 && sl__fs_stat(p, &st) == 0 && S_ISREG(st.st_mode))
		j = sl_json_index(path, &where, key);
	sl__err_clear();
	free(where);
	free(p);
	return j;
}

/*
 * Owns a directory with an index.json that is not LitData's (no "chunks"):
 * one that is not MDS's either then gets this reader's error naming it,
 * not the native reader's "no index.sli".
 */
static int sl_mds_probe(const char *path)
{
	char *p = NULL;
	struct stat st;
	json_t *j;
	int ok = asprintf(&p, "%s/%s", path, SL_MDS_INDEX) >= 0 && sl__fs_stat(p, &st) == 0 && S_ISREG(st.st_mode);

	free(p);
	if (ok && (j = sl_probe_index(path, "chunks")))
		ok = 0, json_decref(j);
	sl__err_clear();
	return ok;
}

/*
 * Where an index's names resolve: the dataset's directory as given, its
 * index.json (for messages) and, for a local one, the directory's real
 * path, which every file it names must lie below once links are followed.
 */
struct sl_root {
	const char *dir, *where;
	int local;
	char real[PATH_MAX];
};

static int sl_root_init(struct sl_root *r, const char *dir, const char *where)
{
	r->dir = dir;
	r->where = where;
	r->local = sl__fs_is_local(dir);
	r->real[0] = 0;
	if (r->local && !realpath(dir, r->real))
		return sl__err(-errno, "%s: %s", dir, strerror(errno));
	return 0;
}

/*
 * 1 where b names a file below an index's directory: a relative path of
 * segments (a merged index's "0/shard.00000.mds", Streaming's
 * merge_index), none empty, "." or "..", without '\\', NUL or, since a web
 * server would read another file for them, '%', '?', '#' or ':'.
 */
static int sl_name_below(const char *b)
{
	size_t n = b ? strlen(b) : 0;

	if (!n || n >= 1024 || b[0] == '/' || strpbrk(b, "\\%?#:"))
		return 0;
	for (const char *seg = b; seg;) {
		const char *slash = strchr(seg, '/');
		size_t l = slash ? (size_t)(slash - seg) : strlen(seg);

		if (!l || (l == 1 && seg[0] == '.') || (l == 2 && seg[0] == '.' && seg[1] == '.'))
			return 0;
		seg = slash ? slash + 1 : NULL;
	}
	return 1;
}

/*
 * DIR/b for a file an index names (sl_name_below), into *out.  A local
 * one that exists must lie below the directory after its links are
 * followed (a link out, to ~/.ssh say, is refused naming it); the version
 * read at open is pinned, so a link swapped in later is -ESTALE.
 */
/* 1 where real (a path with its links followed) is root or below it. */
static int sl_real_below(const char *real, const char *root)
{
	size_t rl = strlen(root);

	return !strncmp(real, root, rl) && (real[rl] == '/' || !real[rl] || rl == 1);
}

static int sl_index_file(const struct sl_root *r, const char *b, char **out)
{
	char real[PATH_MAX], *slash;
	int rc = 0;

	*out = NULL;
	if (!sl_name_below(b))
		return sl__err(SLUICE_EFORMAT, "%s: a shard's name %s%s%s is not a file of the directory", r->where,
			       b ? "'" : "", b ? b : "(none)", b ? "'" : "");
	if (asprintf(out, "%s/%s", r->dir, b) < 0)
		return *out = NULL, -ENOMEM;
	if (!r->local)
		return 0;
	if (realpath(*out, real)) {
		if (strcmp(real, r->real) && sl_real_below(real, r->real))
			return 0;
		rc = sl__err(SLUICE_EFORMAT, "%s: shard '%s' is a link to %s, outside the dataset's directory %s",
			     r->where, b, real, r->real);
	} else {
		/*
		 * Not there (yet): a compressed shard's raw file, which
		 * sl_mds_unzip writes under this name.  Its directory, links
		 * followed, MUST be below the dataset's too: a merged
		 * index's "0/..." with 0 a link out had the decompressed
		 * bytes written outside it.
		 */
		slash = strrchr(*out, '/');
		*slash = 0;
		if (realpath(*out, real) && !sl_real_below(real, r->real))
			rc = sl__err(SLUICE_EFORMAT, "%s: shard '%s' lies in %s, a link outside the dataset's directory %s",
				     r->where, b, real, r->real);
		*slash = '/';
	}
	if (rc) {
		free(*out);
		*out = NULL;
	}
	return rc;
}

/* An index's item count n of the file b: 0 to 2^32 - 1. */
static int sl_index_count(const struct sl_root *r, const char *b, json_t *n, uint64_t *count)
{
	if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > UINT32_MAX)
		return sl__err(SLUICE_EFORMAT, "%s: %s: its sample count", r->where, b);
	*count = (uint64_t)json_integer_value(n);
	return 0;
}

/* 1 where path is a regular file now (a remote one asked of its store). */
static int sl_is_file(const char *path)
{
	struct stat st;
	int ok = sl__fs_stat(path, &st) == 0 && S_ISREG(st.st_mode);

	sl__err_clear();
	return ok;
}

/*
 * Where a shard's decompressed bytes go: its temporary raw file, at most
 * bound bytes of it (got so far).  sl_sink_put: 0, SLUICE_EFORMAT past the
 * bound (a frame that says more than the index), or -errno.
 */
struct sl_sink {
	int fd;
	uint64_t bound, got;
	const char *zip, *tmp;
	int known; /* the bound is the index's raw size, not MDS's 4 GiB */
};

static int sl_sink_put(struct sl_sink *k, const unsigned char *p, size_t n)
{
	if (n > k->bound - k->got)
		return sl__err(SLUICE_EFORMAT, "%s: decompresses to more than the %llu bytes %s", k->zip,
			       (unsigned long long)k->bound, k->known ? "index.json gives it" : "an MDS shard can hold");
	k->got += n;
	while (n) {
		ssize_t w = write(k->fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int e = w < 0 ? errno : EIO;

			return sl__err(-e, "%s: writing it decompressed: %s", k->tmp, strerror(e));
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * The codecs of Streaming's compression= that sluice reads: libarchive's
 * own decoders (its "raw" format: one stream, decompressed), each
 * registered alone, so that a file of another codec is never taken, and
 * only where libarchive has it built in (ARCHIVE_OK): where it would run
 * an outside program instead (ARCHIVE_WARN), the codec is refused.  gzip
 * members and zstd frames one after another are one file, as their tools
 * write them; gzip's CRC and bzip2's block CRCs are checked.
 */
struct sl_unzip_codec {
	const char *name; /* as index.json's "compression" names it, before any ":level" */
	int (*support)(struct archive *a);
	int filter;       /* archive_filter_code() of such a file */
};

static const struct sl_unzip_codec sl_unzip_codecs[] = {
	{ "zstd", archive_read_support_filter_zstd, ARCHIVE_FILTER_ZSTD },
	{ "gz", archive_read_support_filter_gzip, ARCHIVE_FILTER_GZIP },
	{ "bz2", archive_read_support_filter_bzip2, ARCHIVE_FILTER_BZIP2 },
};

/* The whole file (in, n bytes) of codec c decompressed into k, in pieces of buf (cap bytes); 0 or an error naming k->zip. */
static int sl_unzip_run(const struct sl_unzip_codec *c, const unsigned char *in, size_t n, unsigned char *buf,
			size_t cap, struct sl_sink *k)
{
	struct archive *a = archive_read_new();
	struct archive_entry *e;
	int rc = a ? 0 : -ENOMEM;
	la_ssize_t got;

	if (!rc && (c->support(a) != ARCHIVE_OK || archive_read_support_format_raw(a) != ARCHIVE_OK))
		rc = sl__err(SLUICE_EFORMAT, "%s: this build's libarchive has no %s decoder of its own", k->zip, c->name);
	if (!rc && (archive_read_open_memory(a, in, n) != ARCHIVE_OK || archive_read_next_header(a, &e) != ARCHIVE_OK))
		rc = sl__err(SLUICE_EFORMAT, "%s: not %s, or damaged: %s", k->zip, c->name,
			     archive_error_string(a) ?: "no stream");
	if (!rc && archive_filter_code(a, 0) != c->filter)
		rc = sl__err(SLUICE_EFORMAT, "%s: not %s, as index.json says it is", k->zip, c->name);
	while (!rc && (got = archive_read_data(a, buf, cap)) != 0)
		rc = got < 0 ? sl__err(SLUICE_EFORMAT, "%s: not %s, or damaged: %s", k->zip, c->name,
				       archive_error_string(a) ?: "a read error")
			     : sl_sink_put(k, buf, (size_t)got);
	archive_read_free(a);
	return rc;
}

/* The codec Streaming's compression name (NAME or NAME:LEVEL) is, or NULL. */
static const struct sl_unzip_codec *sl_unzip_codec(const char *name)
{
	for (size_t i = 0; name && i < sizeof(sl_unzip_codecs) / sizeof(sl_unzip_codecs[0]); i++) {
		size_t l = strlen(sl_unzip_codecs[i].name);

		if (!strncmp(name, sl_unzip_codecs[i].name, l) && (!name[l] || name[l] == ':'))
			return &sl_unzip_codecs[i];
	}
	return NULL;
}

/*
 * The shard file a shard object names: DIR/raw_data's basename, or where
 * that is absent and the shard is compressed (zip_data), its compressed
 * file in *zip and its codec in *zc, to be decompressed to the raw one
 * (sl_mds_unzip); the codecs of Streaming's that sluice does not read
 * (br, snappy) are refused naming the codec.
 * *raw_bytes: raw_data's size, 0 where the index gives none.
 */
static int sl_mds_file(const struct sl_root *r, json_t *sh, char **out, uint64_t *samples, uint64_t *raw_bytes,
		       char **zip, const struct sl_unzip_codec **zc)
{
	json_t *raw = json_object_get(sh, "raw_data"), *zd = json_object_get(sh, "zip_data");
	const char *b = json_string_value(json_object_get(raw, "basename"));
	const char *z = json_string_value(json_object_get(zd, "basename"));
	const char *codec = json_string_value(json_object_get(sh, "compression"));
	json_t *bytes = json_object_get(raw, "bytes");
	int rc;

	*zip = NULL;
	*raw_bytes = json_is_integer(bytes) && json_integer_value(bytes) > 0 ? (uint64_t)json_integer_value(bytes) : 0;
	if (json_is_integer(bytes) && (json_integer_value(bytes) < 0 || json_integer_value(bytes) > UINT32_MAX))
		return sl__err(SLUICE_EFORMAT, "%s: shard '%s': raw_data's bytes %lld (an MDS shard is under 4 GiB)",
			       r->where, b ? b : "?", (long long)json_integer_value(bytes));
	if ((rc = sl_index_count(r, b ? b : z ? z : "(none)", json_object_get(sh, "samples"), samples)))
		return rc;
	if (!z || !json_is_object(zd))
		return sl_index_file(r, b, out);
	if (!b)
		return sl__err(SLUICE_EFORMAT, "%s: compressed shard '%s' without a raw_data basename to read it as",
			       r->where, z);
	if ((rc = sl_index_file(r, b, out)))
		return rc;
	/* Streaming's local copies are raw: where the raw file is there, it is read. */
	if (sl_is_file(*out))
		return 0;
	if (!(*zc = sl_unzip_codec(codec))) {
		rc = sl__err(SLUICE_EFORMAT, "%s: shard '%s' is compressed with %s (Streaming's compression=\"%s\"), "
			     "which sluice does not read; it reads uncompressed, zstd, gz and bz2 shards: write the "
			     "dataset with one of those, or let Streaming decompress it once (its local copies are raw)",
			     r->where,
			     z, codec ? codec : "an unnamed codec", codec ? codec : "?");
		free(*out);
		*out = NULL;
		return rc;
	}
	return sl_index_file(r, z, zip);
}

/*
 * A compressed shard (zip, of codec c) decompressed once to a raw one, as
 * Streaming does with its local copies: beside it, under the raw name
 * (*raw) the index gives, for a local dataset; beside its cached copy (its
 * name + ".raw") for a remote one, *raw then replaced by that path.
 * Written under a temporary name and renamed, so a raw file is whole or
 * absent; the processes of a machine decompress it once (a lock on the
 * compressed file, held through the check and the write).  The bytes are
 * bounded by the index's raw size (4 GiB without one: MDS offsets are
 * u32) and must be exactly it.  Read in place afterwards like any raw
 * shard.
 */
static int sl_mds_unzip(const struct sl_root *r, const struct sl_unzip_codec *c, const char *zip, char **raw,
			uint64_t raw_bytes)
{
	char local[4096], tag[SL_TAG_MAX] = "", *target = NULL, *tmp = NULL;
	const unsigned char *map = NULL;
	size_t len = 0, cap = 1 << 20;
	struct sl_sink k = { -1, raw_bytes ? raw_bytes : UINT32_MAX, 0, zip, NULL, raw_bytes != 0 };
	unsigned char *buf = NULL;
	int rc, fd = -1;

	if ((rc = sl__fs_local(zip, tag, local, sizeof(local))))
		return rc;
	if (r->local)
		target = strdup(*raw);
	else if (asprintf(&target, "%s.raw", local) < 0)
		target = NULL;
	if (!target || asprintf(&tmp, "%s.tmp%d", target, (int)getpid()) < 0) {
		free(target);
		return -ENOMEM;
	}
	k.tmp = tmp;
	if ((fd = sl__open_file(local, O_RDONLY, 0)) < 0) {
		rc = fd;
		goto out;
	}
	flock(fd, LOCK_EX); /* advisory: without it each process decompresses its own copy, no harm done */
	if (sl_is_file(target))
		goto out;
	/* A directory, FIFO or device under the raw name is refused, never renamed over. */
	if ((rc = sl__replaceable(target)))
		goto out;
	if ((rc = sl__map_ro(local, &map, &len, 0)))
		goto out;
	if (!(buf = malloc(cap))) {
		rc = -ENOMEM;
		goto out;
	}
	if ((k.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
		rc = sl__err(-errno, "%s: compressed; sluice decompresses it once, as Streaming does, to %s, but cannot "
			     "write there (%s): decompress it where it can be written, or read the dataset once with "
			     "Streaming", zip, target, strerror(errno));
		goto out;
	}
	rc = sl_unzip_run(c, map, len, buf, cap, &k);
	if (!rc && raw_bytes && k.got != raw_bytes)
		rc = sl__err(SLUICE_EFORMAT, "%s: decompresses to %llu bytes, index.json says %llu", zip,
			     (unsigned long long)k.got, (unsigned long long)raw_bytes);
	if (!rc && (fsync(k.fd) < 0 || rename(tmp, target) < 0))
		rc = sl__err(-errno, "%s: %s", target, strerror(errno));
out:
	if (k.fd >= 0) {
		close(k.fd);
		if (rc)
			unlink(tmp);
	}
	if (fd >= 0)
		close(fd); /* the lock with it */
	if (map)
		munmap((void *)map, len);
	free(buf);
	free(tmp);
	if (!rc) {
		free(*raw);
		*raw = target;
	} else {
		free(target);
	}
	return rc;
}

/*
 * An open's end, whatever came before (rc): where it went well, the n
 * files bound to ds, each's header checked against its count in
 * samples[]; else the files freed.  The index (j, where) and samples freed.
 */
static int sl_shards_load(struct sluice_dataset *ds, struct sl_mds *m, int rc, char **files, unsigned n,
			  uint64_t *samples, json_t *j, char *where)
{
	size_t cap = 0;

	if (rc)
		sluice_list_free(files, n);
	else
		rc = sl__ds_files(ds, files, n);

	for (unsigned c = 0; c < m->cols.n; c++)
		m->cols.unit[c] = (uint32_t)sluice_dtype_size(ds->fields[c].dtype);

	if (!rc && (!(m->first = calloc(n + 1, sizeof(uint64_t))) || !(m->at = calloc(n + 1, sizeof(uint64_t))) ||
		    !(ds->file_records = calloc(n, sizeof(uint64_t)))))
		rc = -ENOMEM;
	for (unsigned s = 0; !rc && s < n; s++)
		rc = sl_mds_shard(ds, m, s, samples[s], &cap);
	if (!rc)
		ds->nrecords = m->first[n];
	ds->has_crc = 0;
	free(samples);
	json_decref(j);
	free(where);
	return rc;
}

static int sl_mds_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_mds *m = calloc(1, sizeof(*m));
	struct sl_root root;
	char *where = NULL, **files = NULL;
	json_t *j = m ? sl_json_index(path, &where, "shards") : NULL, *shards = json_object_get(j, "shards");
	size_t n = json_array_size(shards);
	uint64_t *samples = NULL;
	int rc = !m ? -ENOMEM : !j ? (where ? SLUICE_EFORMAT : -ENOMEM) : 0;

	ds->priv = m;
	if (!rc && (!n || n > SL_MAX_SHARDS))
		rc = sl__err(SLUICE_EFORMAT, "%s: %zu shards (1 to %u)", where, n, SL_MAX_SHARDS);
	if (!rc && (!(files = calloc(n, sizeof(char *))) || !(samples = calloc(n, sizeof(uint64_t)))))
		rc = -ENOMEM;
	if (!rc && !(m->raw_bytes = calloc(n, sizeof(uint64_t))))
		rc = -ENOMEM;
	if (!rc)
		rc = sl_root_init(&root, path, where);
	for (size_t s = 0; !rc && s < n; s++) {
		json_t *sh = json_array_get(shards, s);
		char *zip = NULL;
		const struct sl_unzip_codec *zc = NULL;

		if (strcmp(json_string_value(json_object_get(sh, "format")) ?: "", "mds"))
			rc = sl__err(SLUICE_EFORMAT, "%s: shard %zu is not of format mds", where, s);
		else if (!(rc = sl_mds_columns(ds, m, sh, s ? json_array_get(shards, 0) : NULL, where)))
			rc = sl_mds_file(&root, sh, &files[s], &samples[s], &m->raw_bytes[s], &zip, &zc);
		if (!rc && zip)
			rc = sl_mds_unzip(&root, zc, zip, &files[s], m->raw_bytes[s]);
		free(zip);
	}
	return sl_shards_load(ds, m, rc, files, (unsigned)n, samples, j, where);
}

static void sl_mds_close(struct sluice_dataset *ds)
{
	struct sl_mds *m = ds->priv;

	if (!m)
		return;
	for (unsigned s = 0; m->arrow && s < ds->nfiles; s++)
		if (m->arrow[s]) {
			sl__arrow_free(&m->arrow[s]->a);
			free(m->arrow[s]->loff);
			free(m->arrow[s]);
		}
	for (unsigned s = 0; m->blocks && s < ds->nfiles; s++)
		free(m->blocks[s]);
	if (m->have_lock)
		pthread_mutex_destroy(&m->lock);
	free(m->arrow);
	free(m->blocks);
	free(m->nblocks);
	free(m->c_buf);
	free(m->c_src);
	free(m->off);
	free(m->first);
	free(m->at);
	free(m->raw_bytes);
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

int sl__offsets_parse(const unsigned char *p, size_t len, uint32_t *off)
{
	uint64_t n = len >= 4 ? sl__le32(p) : 0;

	if (len < 4 || (n + 2) * 4 > len)
		return sl__err(SLUICE_EFORMAT, "%llu samples' offsets do not fit its %zu bytes", (unsigned long long)n, len);
	for (uint64_t i = 0; i <= n; i++) {
		uint32_t o = sl__le32(p + 4 + 4 * i);

		if (o < (n + 2) * 4 || o > len || (i && o < off[i - 1]))
			return sl__err(SLUICE_EFORMAT, "sample %llu's offset %u out of order or outside the file",
				       (unsigned long long)(i ? i - 1 : 0), o);
		off[i] = o;
	}
	return 0;
}

int sl__cols_split(const struct sl__cols *cols, const unsigned char *p, size_t len, const void **data, size_t *lens,
		   unsigned *bad)
{
	size_t at, var = 0;

	*bad = 0;
	for (unsigned c = 0; c < cols->n; c++)
		var += !cols->size[c];
	if (var * 4 > len)
		return sl__err(SLUICE_EFORMAT, "%zu bytes cannot hold its %zu sizes", len, var);
	at = var * 4;
	for (unsigned c = 0, v = 0; c < cols->n; c++) {
		size_t size = cols->size[c] ? cols->size[c] : sl__le32(p + 4 * v++);

		*bad = c;
		if (size > len - at)
			return sl__err(SLUICE_EFORMAT, "%zu bytes run past its %zu", size, len);
		if ((cols->want[c] && size != cols->want[c]) || (cols->unit[c] > 1 && size % cols->unit[c]))
			return sl__err(SLUICE_EFORMAT, "%zu bytes are not whole values of %u bytes", size,
				       cols->want[c] ? cols->want[c] : cols->unit[c]);
		data[c] = p + at;
		lens[c] = size;
		at += size;
	}
	*bad = cols->n;
	return at == len ? 0 : sl__err(SLUICE_EFORMAT, "%zu bytes left over after its columns", len - at);
}

static int sl_mds_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			 struct sluice_record *rec)
{
	const struct sl_mds *m = ds->priv;
	const void *data[SLUICE_MAX_FIELDS];
	size_t lens[SLUICE_MAX_FIELDS];
	unsigned bad;
	int rc = sl__cols_split(&m->cols, p, len, data, lens, &bad);

	if (rc)
		return sl__err(rc, "sample %llu%s%s%s: %s", (unsigned long long)i, bad < m->cols.n ? ", column '" : "",
			       bad < m->cols.n ? ds->fields[bad].name : "", bad < m->cols.n ? "'" : "",
			       sluice_last_error_detail());
	for (unsigned c = 0; rec && c < m->cols.n; c++) {
		rec->data[c] = data[c];
		rec->len[c] = lens[c];
	}
	return 0;
}

/* ---- LitData ---- */

/* A LitData leaf format's field: int, float, bool, a 1-D array without header of its dtype, else bytes. */
static void sl_ld_field(struct sluice_dataset *ds, struct sl_mds *m, unsigned c, const char *fmt)
{
	static const int numpy[] = { SLUICE_DTYPE_I8,  SLUICE_DTYPE_I16, SLUICE_DTYPE_I32, SLUICE_DTYPE_I64,
				     SLUICE_DTYPE_U8,  SLUICE_DTYPE_U16, SLUICE_DTYPE_U32, -1,
				     SLUICE_DTYPE_F16, SLUICE_DTYPE_F32, SLUICE_DTYPE_F64 };
	static const int torch[] = { SLUICE_DTYPE_F32, SLUICE_DTYPE_F32, SLUICE_DTYPE_F64, SLUICE_DTYPE_F64, -1, -1, -1,
				     -1, SLUICE_DTYPE_F16, SLUICE_DTYPE_F16, SLUICE_DTYPE_BF16, SLUICE_DTYPE_U8,
				     SLUICE_DTYPE_I8, SLUICE_DTYPE_I16, SLUICE_DTYPE_I16, SLUICE_DTYPE_I32,
				     SLUICE_DTYPE_I32, SLUICE_DTYPE_I64, SLUICE_DTYPE_I64, SLUICE_DTYPE_U8,
				     SLUICE_DTYPE_U16 };
	struct sluice_field *f = &ds->fields[c];
	unsigned k;
	int n = 0;

	*f = (struct sluice_field){ ds->names[c], SLUICE_DTYPE_BYTES, 0, { 0 } };
	if (!strcmp(fmt, "int") || !strcmp(fmt, "float") || !strcmp(fmt, "bool")) {
		f->dtype = fmt[0] == 'i' ? SLUICE_DTYPE_I64 : fmt[0] == 'f' ? SLUICE_DTYPE_F64 : SLUICE_DTYPE_U8;
		m->cols.want[c] = (uint32_t)sluice_dtype_size(f->dtype);
	} else if ((sscanf(fmt, "no_header_numpy:%u%n", &k, &n) == 1 && !fmt[n] && k < 11 && numpy[k] >= 0) ||
		   (sscanf(fmt, "no_header_tensor:%u%n", &k, &n) == 1 && !fmt[n] && k < 21 && torch[k] >= 0)) {
		f->dtype = (enum sluice_dtype)(fmt[10] == 'n' ? numpy[k] : torch[k]);
		f->ndim = 1;
		f->shape[0] = -1;
	}
}

/* The leaves of a sample as data_spec gives them (a flat dict's keys, a tuple's or list's positions). */
static int sl_ld_columns(struct sluice_dataset *ds, struct sl_mds *m, json_t *config, const char *where)
{
	json_t *fmt = json_object_get(config, "data_format");
	const char *spec = json_string_value(json_object_get(config, "data_spec"));
	json_t *sj = spec ? json_loads(spec, JSON_REJECT_DUPLICATES, NULL) : NULL, *root = json_array_get(sj, 1);
	const char *type = json_string_value(json_object_get(root, "type")) ?: "";
	const char *ctx = json_string_value(json_object_get(root, "context"));
	json_t *keys = !strcmp(type, "builtins.dict") && ctx ? json_loads(ctx, 0, NULL) : NULL;
	json_t *kids = json_object_get(root, "children_spec");
	size_t n = json_array_size(fmt);
	int rc = 0;

	if (!n || n > SLUICE_MAX_FIELDS || json_array_size(kids) != n || (keys && json_array_size(keys) != n) ||
	    (!keys && strcmp(type, "builtins.tuple") && strcmp(type, "builtins.list")))
		rc = sl__err(SLUICE_EFORMAT, "%s: config's data_format and data_spec: sluice reads samples that are one flat "
			     "dict, tuple or list of 1 to %u leaves", where, SLUICE_MAX_FIELDS);
	for (size_t c = 0; !rc && c < n; c++) {
		json_t *key = json_array_get(keys, c);
		const char *f = json_string_value(json_array_get(fmt, c));

		if (!json_is_null(json_object_get(json_array_get(kids, c), "type")))
			rc = sl__err(SLUICE_EFORMAT, "%s: leaf %zu is a nested container (sluice reads flat samples)", where, c);
		else if (!f)
			rc = sl__err(SLUICE_EFORMAT, "%s: data_format %zu is not a string", where, c);
		else if (keys && json_is_string(key) && strlen(json_string_value(key)) >= sizeof(ds->names[c]))
			rc = sl__err(SLUICE_EFORMAT, "%s: key %zu is longer than %zu bytes", where, c, sizeof(ds->names[c]) - 1);
		else if (keys && json_is_string(key))
			snprintf(ds->names[c], sizeof(ds->names[c]), "%s", json_string_value(key));
		else if (keys && json_is_integer(key))
			snprintf(ds->names[c], sizeof(ds->names[c]), "%lld", (long long)json_integer_value(key));
		else if (keys)
			rc = sl__err(SLUICE_EFORMAT, "%s: key %zu of the samples is not a string or an integer", where, c);
		else
			snprintf(ds->names[c], sizeof(ds->names[c]), "%zu", c);
		if (!rc)
			sl_ld_field(ds, m, (unsigned)c, f);
	}
	json_decref(keys);
	json_decref(sj);
	ds->nfields = m->cols.n = (unsigned)n;
	return rc ? rc : sl__schema_check(ds->fields, ds->nfields);
}

/*
 * Chunk s's Arrow footer, where its items are all empty (LitData's writer
 * keeps a flat dict of strings and numbers only there: "LDARW01\0" last,
 * after the IPC bytes and their u32 length): its table parsed and checked
 * against the fields index.json gives (names, types, the row count), each
 * row's place as laid out computed, one block a record batch.  A chunk
 * with items is left as it is.
 */
static int sl_ld_chunk(struct sluice_dataset *ds, struct sl_mds *m, unsigned s, const unsigned char *p, size_t len,
		       uint64_t n)
{
	const uint32_t *off = m->off + m->at[s];
	uint64_t head = 4 * (n + 2), ipc, start;
	struct sl_ld_arrow *ar;
	struct sl__block *b;
	const char *name = ds->files[s];
	int rc;

	for (uint64_t k = 0; k <= n; k++)
		if (!n || off[k] != head)
			return 0; /* items of its own: read as they lie */
	if (len < head + 12 || memcmp(p + len - 8, "LDARW01", 8))
		return sl__err(SLUICE_EFORMAT, "%s: %llu samples, each of 0 bytes, and no Arrow row footer to hold them",
			       name, (unsigned long long)n);
	ipc = sl__le32(p + len - 12);
	if (ipc > len - 12 - head)
		return sl__err(SLUICE_EFORMAT, "%s: its Arrow row footer of %llu bytes runs past the chunk's %zu", name,
			       (unsigned long long)ipc, len);
	start = len - 12 - ipc;
	if (!ds->codec)
		ds->codec = "none";
	if ((!m->arrow && !(m->arrow = calloc(ds->nfiles, sizeof(*m->arrow)))) ||
	    (!m->blocks && !(m->blocks = calloc(ds->nfiles, sizeof(*m->blocks)))) ||
	    (!m->nblocks && !(m->nblocks = calloc(ds->nfiles, sizeof(*m->nblocks)))) || !(ar = calloc(1, sizeof(*ar))))
		return -ENOMEM;
	m->arrow[s] = ar; /* freed with the dataset from here on */
	if ((rc = sl__arrow_parse(p + start, (size_t)ipc, start, &ar->a, name)))
		return rc;
	if (ar->a.rows != n)
		return sl__err(SLUICE_EFORMAT, "%s: %llu rows in its Arrow footer, %llu samples in the chunk", name,
			       (unsigned long long)ar->a.rows, (unsigned long long)n);
	for (unsigned c = 0; c < ar->a.ncols || c < ds->nfields; c++) {
		const struct sl__acol *col = c < ar->a.ncols ? &ar->a.col[c] : NULL;
		const struct sluice_field *f = c < ds->nfields ? &ds->fields[c] : NULL;

		if (!col || !f || strcmp(col->name, f->name) || col->dtype != f->dtype || f->ndim)
			return sl__err(SLUICE_EFORMAT, "%s: its Arrow rows' column %u is %s%s%s (%s), index.json's data_format "
				       "and data_spec say %s%s%s (%s): a sample with keys the first did not have (LitData "
				       "gives None for them elsewhere)", name, c, col ? "'" : "", col ? col->name : "none",
				       col ? "'" : "", col ? sluice_dtype_name(col->dtype) : "-", f ? "'" : "",
				       f ? f->name : "none", f ? "'" : "", f ? sluice_dtype_name(f->dtype) : "-");
	}
	if (!(ar->loff = calloc(n + 1, sizeof(uint64_t))) || !(b = calloc(ar->a.nbatches ? ar->a.nbatches : 1, sizeof(*b))))
		return -ENOMEM;
	m->blocks[s] = b;
	for (uint64_t k = 0; !rc && k < ar->a.nbatches; k++) {
		const struct sl__abatch *ab = &ar->a.b[k];

		rc = sl__arrow_rows_len(&ar->a, k, p + ab->body, ar->loff + ab->first, name);
		if (!rc && (ab->body_len > UINT32_MAX || ar->loff[ab->first + ab->rows] - ar->loff[ab->first] > UINT32_MAX))
			rc = sl__err(SLUICE_EFORMAT, "%s: record batch %llu: 4 GiB or more", name, (unsigned long long)k);
		b[k] = (struct sl__block){ ar->loff[ab->first], ab->body, (uint32_t)ab->body_len,
					   (uint32_t)(ar->loff[ab->first + ab->rows] - ar->loff[ab->first]), 0, 0 };
		if (ab->codec == SL_ACODEC_ZSTD)
			ds->codec = "zstd";
	}
	m->nblocks[s] = ar->a.nbatches;
	ds->file_bytes[s] = ar->loff[n]; /* its records' bytes as laid out, where locate points */
	ds->compressed = 1;
	return rc;
}

/*
 * A dataset with Arrow chunks reads every record through blocks: a chunk
 * of items gets runs of them (up to 1 MiB, or one item) as they lie.
 */
static int sl_ld_item_blocks(struct sluice_dataset *ds, struct sl_mds *m)
{
	for (unsigned s = 0; s < ds->nfiles; s++) {
		const uint32_t *off = m->off + m->at[s];
		uint64_t n = ds->file_records[s], nb = 0;
		struct sl__block *b;

		if (m->arrow[s])
			continue;
		if (!(b = malloc((n ? n : 1) * sizeof(*b))))
			return -ENOMEM;
		m->blocks[s] = b;
		for (uint64_t k0 = 0, k1; k0 < n; k0 = k1) {
			for (k1 = k0 + 1; k1 < n && off[k1 + 1] - off[k0] <= (1u << 20); k1++)
				;
			b[nb++] = (struct sl__block){ off[k0], off[k0], off[k1] - off[k0], off[k1] - off[k0], 0, 0 };
		}
		m->nblocks[s] = nb;
	}
	return 0;
}

static void sl_ld_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_mds *m = ds->priv;
	unsigned s = sl__ds_file_of(m->first, ds->nfiles, i);
	const struct sl_ld_arrow *ar = m->arrow ? m->arrow[s] : NULL;
	uint64_t r = i - m->first[s];

	if (!ar) {
		sl_mds_locate(ds, i, loc);
		return;
	}
	loc->shard = s;
	loc->offset = ar->loff[r];
	loc->length = (uint32_t)(ar->loff[r + 1] - ar->loff[r]);
	loc->crc = 0;
}

static int sl_ld_blocks(struct sluice_dataset *ds, unsigned s, const struct sl__block **b, uint64_t *n)
{
	const struct sl_mds *m = ds->priv;

	*b = m->blocks[s];
	*n = m->nblocks[s];
	return 0;
}

/* An Arrow batch's rows laid out as LitData's items; a run of items copied as it lies. */
static int sl_ld_block_decode(struct sluice_dataset *ds, unsigned s, uint64_t k, const struct sl__block *b,
			      const void *src, void *dst)
{
	const struct sl_mds *m = ds->priv;
	const struct sl_ld_arrow *ar = m->arrow[s];

	if (!ar) {
		memcpy(dst, src, b->len);
		return 0;
	}
	return sl__arrow_rows(&ar->a, k, src, ar->loff + ar->a.b[k].first, dst, ds->files[s]);
}

/* One record of a dataset read through blocks: an item read where it lies; an Arrow row from its batch, laid out. */
static int sl_ld_fetch(struct sluice_dataset *ds, uint64_t i, const struct sluice_record_loc *loc, void *buf)
{
	struct sl_mds *m = ds->priv;
	const struct sl__block *b = m->blocks[loc->shard];
	uint64_t lo = 0, hi = m->nblocks[loc->shard];
	int rc = 0;

	if (!m->arrow[loc->shard])
		return sl__ds_pread(ds, loc->shard, buf, loc->length, loc->offset, "record", i);
	while (hi - lo > 1) { /* the last block starting at or before the record */
		uint64_t mid = lo + (hi - lo) / 2;

		if (b[mid].logical <= loc->offset)
			lo = mid;
		else
			hi = mid;
	}
	if (!m->nblocks[loc->shard] || loc->offset < b[lo].logical || loc->offset + loc->length > b[lo].logical + b[lo].len)
		return sl__err(SLUICE_EFORMAT, "%s: record %llu lies in no record batch", ds->files[loc->shard],
			       (unsigned long long)i);
	pthread_mutex_lock(&m->lock);
	if (!m->c_valid || m->c_shard != loc->shard || m->c_block != lo) {
		m->c_valid = 0;
		if (sl__reserve(&m->c_src, &m->c_src_cap, b[lo].stored ? b[lo].stored : 1) ||
		    sl__reserve(&m->c_buf, &m->c_cap, b[lo].len ? b[lo].len : 1))
			rc = -ENOMEM;
		if (!rc)
			rc = sl__ds_pread(ds, loc->shard, m->c_src, b[lo].stored, b[lo].file, "record batch", lo);
		if (!rc)
			rc = sl_ld_block_decode(ds, loc->shard, lo, &b[lo], m->c_src, m->c_buf);
		m->c_valid = !rc;
		m->c_shard = loc->shard;
		m->c_block = lo;
	}
	if (!rc)
		memcpy(buf, m->c_buf + (loc->offset - b[lo].logical), loc->length);
	pthread_mutex_unlock(&m->lock);
	return rc;
}

/* Stored and laid-out bytes of the records where Arrow buffers are zstd, for the ratio sluice inspect shows. */
static int sl_ld_sizes(struct sluice_dataset *ds, uint64_t *stored, uint64_t *logical)
{
	const struct sl_mds *m = ds->priv;

	*stored = *logical = 0;
	if (!m->nblocks || !ds->codec || strcmp(ds->codec, "zstd"))
		return 0; /* nothing compressed: the ratio is 1 */
	for (unsigned s = 0; s < ds->nfiles; s++)
		for (uint64_t k = 0; k < m->nblocks[s]; k++) {
			*stored += m->blocks[s][k].stored;
			*logical += m->blocks[s][k].len;
		}
	return 0;
}

/* Owns a directory whose index.json has chunks and a config. */
static int sl_ld_probe(const char *path)
{
	json_t *j = sl_probe_index(path, "chunks");
	int ok = j && json_is_object(json_object_get(j, "config"));

	json_decref(j);
	return ok;
}

static int sl_ld_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_mds *m = calloc(1, sizeof(*m));
	struct sl_root root;
	char *where = NULL, **files = NULL;
	json_t *j = m ? sl_json_index(path, &where, "chunks") : NULL, *chunks = json_object_get(j, "chunks");
	json_t *config = json_object_get(j, "config");
	size_t n = json_array_size(chunks);
	uint64_t *items = NULL;
	int rc = !m ? -ENOMEM : !j ? (where ? SLUICE_EFORMAT : -ENOMEM) : 0;

	ds->priv = m;
	if (!rc && strcmp(json_string_value(json_object_get(config, "item_loader")) ?: "", "PyTreeLoader"))
		rc = sl__err(SLUICE_EFORMAT, "%s: item_loader %s: sluice reads LitData's PyTreeLoader chunks", where,
			     json_string_value(json_object_get(config, "item_loader")) ?: "(none)");
	if (!rc && ((json_object_get(config, "compression") && !json_is_null(json_object_get(config, "compression"))) ||
		    (json_object_get(config, "encryption") && !json_is_null(json_object_get(config, "encryption")))))
		rc = sl__err(SLUICE_EFORMAT, "%s: compressed or encrypted chunks; sluice reads chunks written without either",
			     where);
	if (!rc && (!n || n > SL_MAX_SHARDS))
		rc = sl__err(SLUICE_EFORMAT, "%s: %zu chunks (1 to %u)", where, n, SL_MAX_SHARDS);
	if (!rc)
		rc = sl_ld_columns(ds, m, config, where);
	if (!rc && (!(files = calloc(n, sizeof(char *))) || !(items = calloc(n, sizeof(uint64_t)))))
		rc = -ENOMEM;
	if (!rc)
		rc = sl_root_init(&root, path, where);
	for (size_t c = 0; !rc && c < n; c++) {
		json_t *ch = json_array_get(chunks, c);
		const char *name = json_string_value(json_object_get(ch, "filename"));

		rc = sl_index_count(&root, name ? name : "(none)", json_object_get(ch, "chunk_size"), &items[c]);
		if (!rc)
			rc = sl_index_file(&root, name, &files[c]);
	}
	m->litdata = 1;
	if (!rc && !(rc = pthread_mutex_init(&m->lock, NULL) ? -ENOMEM : 0))
		m->have_lock = 1;
	rc = sl_shards_load(ds, m, rc, files, (unsigned)n, items, j, where);
	return !rc && ds->compressed ? sl_ld_item_blocks(ds, m) : rc;
}

const struct sl__ds_ops sl__ds_litdata_ops = {
	.name = "litdata",
	.probe = sl_ld_probe,
	.open = sl_ld_open,
	.close = sl_mds_close,
	.locate = sl_ld_locate,
	.decode = sl_mds_decode,
	.fetch = sl_ld_fetch,
	.blocks = sl_ld_blocks,
	.block_decode = sl_ld_block_decode,
	.sizes = sl_ld_sizes,
};

const struct sl__ds_ops sl__ds_mds_ops = {
	.name = "mds",
	.probe = sl_mds_probe,
	.open = sl_mds_open,
	.close = sl_mds_close,
	.locate = sl_mds_locate,
	.decode = sl_mds_decode,
};
