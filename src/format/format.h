/*
 * format: sluice's dataset files (docs/FORMAT.md).  Parsers here take
 * bytes from outside and MUST bound every read by the length they are
 * given; fuzz targets in tests/fuzz feed them directly.  Depends on core,
 * and on store/'s names (store/names.h: what a path is, listing, the
 * cache of remote files), whatever store a dataset is on; never on
 * engine/, gpu/ or remote/.
 */
#ifndef SL_FORMAT_H
#define SL_FORMAT_H

#include <stdio.h>
#include <string.h>

#include <pthread.h>

#include "core/core.h"
#include "store/names.h"

#define SL_SHARD_MAGIC "SLUICESH"
#define SL_INDEX_MAGIC "SLUICEIX"
#define SL_FORMAT_VERSION 2  /* what writers write; readers read 1 and 2 */
#define SL_HDR_SIZE 4096u
#define SL_INDEX_NAME "index.sli"
#define SL_MAX_SHARDS 65535u
#define SL_ENTRY 12u /* bytes per index entry: u32 offset / 8, u32 length, u32 crc */
#define SL_EGROUP 4096u /* entries per CRC of the index's entry table (version 2) */
#define SL_MAX_SHARD_BYTES ((1ull << 35) - SL_HDR_SIZE) /* offsets / 8 fit in u32 */
#define SL_FLAG_ZSTD 1u      /* index and shard flag: data in zstd blocks */
#define SL_FLAG_BLOCK_CRC 2u /* shard flag: the block table ends in a CRC32C of each block's stored bytes */
#define SL_BLOCK_ENTRY 24u   /* bytes per block table entry (and 4 more for its CRC with SL_FLAG_BLOCK_CRC) */
#define SL_MIN_BLOCK (1u << 20)

/*
 * Fuzzing builds accept any stored CRC so mutations reach the parsing
 * behind it (the usual FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION rule).
 */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define SL_CRC_BAD(stored, computed) ((void)(stored), (void)(computed), 0)
#else
#define SL_CRC_BAD(stored, computed) ((stored) != (computed))
#endif

static inline uint32_t sl__le32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return le32toh(v);
}

static inline uint64_t sl__le64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return le64toh(v);
}

static inline void sl__put32(void *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static inline void sl__put64(void *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

/* Fixed byte size of a field's value, or 0 if a dimension is variable. */
SL_HIDDEN size_t sl__field_fixed_size(const struct sluice_field *f);
/* Checks a schema (names, dtypes, shapes); SLUICE_EINVAL_CONFIG naming the field. */
SL_HIDDEN int sl__schema_check(const struct sluice_field *f, unsigned n);

/* A parsed index header, schema and shard table. */
struct sl__index {
	uint32_t nfields, nshards, flags;
	uint64_t nrecords;
	uint64_t schema_off, schema_len, shards_off, entries_off;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	char names[SLUICE_MAX_FIELDS][256];
	uint64_t *shard_records; /* nshards each; malloc'd */
	uint64_t *shard_bytes;
	uint64_t *shard_first;   /* global number of each shard's first record */
	uint32_t version;
	uint64_t ngroups, groups_off; /* version 2: the CRC of each group of SL_EGROUP entries, at groups_off */
	uint64_t meta_off, meta_len;  /* version 2: the dataset's metadata (JSON text), after the group CRCs */
};
#define SL_META_MAX (16u << 20) /* bytes of a dataset's metadata */

/*
 * Parses the first len bytes of an index file (at least up to the end of
 * its shard table) and checks them: magic, version, CRCs, bounds, schema.
 * file_size is the whole file's size, to check the entries fit.  Returns
 * 0 or SLUICE_EFORMAT with a detail naming what is wrong.  Free with
 * sl__index_free().
 */
SL_HIDDEN int sl__index_parse(const unsigned char *p, size_t len, uint64_t file_size,
			      struct sl__index *ix);
SL_HIDDEN void sl__index_free(struct sl__index *ix);
/*
 * Serialises schema, shard table and the entries' group CRCs (group_crc:
 * ceil(nrecords / SL_EGROUP) of them) behind a 4 KiB header; returns
 * malloc'd bytes and size: the entries follow.
 */
SL_HIDDEN int sl__index_build(const struct sluice_field *f, unsigned nfields, uint64_t nrecords,
			      const uint32_t *group_crc, const char *meta,
			      const uint64_t *shard_records, const uint64_t *shard_bytes,
			      unsigned nshards, uint32_t flags, unsigned char **out, size_t *out_len);

/* A shard header.  With SL_FLAG_ZSTD the data is zstd blocks listed in a block table. */
struct sl__shard_hdr {
	uint32_t shard, flags;
	uint64_t nrecords, data_len; /* data_len: logical (uncompressed) bytes */
	uint64_t table_off, nblocks; /* the block table: file offset, entries */
	uint32_t table_crc;
};
/*
 * One compressed block: logical bytes [logical, logical + len) stored at
 * file offset file; crc: the CRC32C of its stored bytes, where has_crc.
 */
struct sl__block {
	uint64_t logical, file;
	uint32_t stored, len;
	uint32_t crc, has_crc;
};
/* The block table's bytes in the file. */
static inline uint64_t sl__block_table_len(const struct sl__shard_hdr *sh)
{
	return (SL_BLOCK_ENTRY + (sh->flags & SL_FLAG_BLOCK_CRC ? 4u : 0u)) * sh->nblocks;
}
/* Shard header: encode into 4096 bytes; parse and check. */
SL_HIDDEN void sl__shard_header(unsigned char *h, const struct sl__shard_hdr *sh);
SL_HIDDEN int sl__shard_header_parse(const unsigned char *h, size_t len, struct sl__shard_hdr *sh);
/* Parses and checks a block table of sh->nblocks entries held in p[0..len) into b. */
SL_HIDDEN int sl__blocks_parse(const unsigned char *p, size_t len, const struct sl__shard_hdr *sh,
			       struct sl__block *b);

/*
 * Dataset readers are ops tables, one per on-disk format, tried in order
 * by sluice_dataset_open().  A reader describes records as extents of its
 * data files (ds->files); the generic layer opens files, reads extents,
 * checks CRCs where the format has them, and calls decode.
 */
struct sl__ds_ops {
	const char *name;
	/*
	 * one_file: one file can be the whole dataset.  A URL with a query (a
	 * presigned one) names one object and no other beside it, so only
	 * these readers are asked of it.
	 */
	int one_file;
	/* probe: required.  1 if this reader owns path (cheap: names and magics only). */
	int (*probe)(const char *path);
	/*
	 * open: required.  Fills nrecords, fields, files, has_crc and priv,
	 * in O(1) of the record count where the format allows.  Returns 0 or
	 * an error whose detail names the file.
	 */
	int (*open)(struct sluice_dataset *ds, const char *path);
	/* close: required.  Frees priv (files are the generic layer's). */
	void (*close)(struct sluice_dataset *ds);
	/* locate: required.  Record i's extent; i is in range. */
	void (*locate)(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc);
	/*
	 * entry_check: optional.  Checks record i's index entry against the
	 * index's own checksums, at O(1) amortised cost (a group of entries
	 * is checked once); 0, or SLUICE_EFORMAT naming the index.  Called
	 * before any use of what locate gives.
	 */
	int (*entry_check)(const struct sluice_dataset *ds, uint64_t i);
	/* decode: required.  Splits a record's bytes into fields; SLUICE_EFORMAT if malformed. */
	int (*decode)(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
		      struct sluice_record *rec);
	/*
	 * check: optional.  Format-level checks for verify beyond reading every
	 * record (headers against the index, ordering); reports through bad.
	 */
	int64_t (*check)(struct sluice_dataset *ds, void (*bad)(const struct sluice_bad *, void *), void *user);
	/*
	 * fetch: required when the reader sets ds->compressed.  Copies record
	 * i's bytes (loc->length of them) into buf; loc is in logical bytes.
	 */
	int (*fetch)(struct sluice_dataset *ds, uint64_t i, const struct sluice_record_loc *loc, void *buf);
	/* sizes: optional.  Stored and logical data bytes, for the compression ratio. */
	int (*sizes)(struct sluice_dataset *ds, uint64_t *stored, uint64_t *logical);
	/*
	 * blocks: required when the reader sets ds->compressed.  Shard s's block
	 * table into *b (n entries, valid while ds is open), loaded on first use.
	 */
	int (*blocks)(struct sluice_dataset *ds, unsigned s, const struct sl__block **b, uint64_t *n);
	/*
	 * block_decode: optional, for a reader whose blocks are not zstd frames
	 * (LitData's Arrow record batches, laid out as rows).  Block k of shard
	 * s (b, from blocks) decoded from its stored bytes src (b->stored of
	 * them, already CRC-checked where it has one) into dst (b->len bytes);
	 * called from any thread at once.  NULL: zstd.  0, or SLUICE_EFORMAT
	 * naming the file.
	 */
	int (*block_decode)(struct sluice_dataset *ds, unsigned s, uint64_t k, const struct sl__block *b,
			    const void *src, void *dst);
};

struct sluice_dataset {
	const struct sl__ds_ops *ops;
	uint64_t id;             /* unique in the process, never reused (the engine's bound files are keyed on it) */
	char *path;
	char *metadata;          /* the dataset's metadata, NUL-terminated (malloc'd), or NULL */
	uint64_t nrecords;
	unsigned nfields;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	char names[SLUICE_MAX_FIELDS][256];
	unsigned nfiles;
	char **files;            /* data file paths, by loc.shard */
	uint64_t *file_bytes;    /* bytes of each file records may use (from offset 0) */
	uint64_t *file_records;  /* records in each file, or NULL if the format does not say */
	_Atomic int *fds;        /* opened on first use */
	char **local;            /* s3:// datasets: each file's cached copy, fetched on first use */
	char **fetch_err;        /* and why its fetch failed: not tried again while the dataset is open */
	int *fetch_rc;
	pthread_mutex_t local_lock;
	struct sl__prefetch *prefetch; /* remote datasets: the files fetched ahead, from the first use on */
	int prefetch_tried;
	unsigned *plan, nplan;   /* the files a loader will read this epoch, in first-use order (sl__ds_plan); NULL: all */
	char (*tags)[SL_TAG_MAX]; /* remote files: the version each was first read at ("": not yet), every later read pinned to it */
	int has_crc;             /* loc.crc is meaningful */
	int compressed;          /* records are not extents of files: read them with ops->fetch */
	const char *codec;       /* where compressed, what its stored bytes are in ("zstd" where NULL; "none") */
	struct sl__hist h_decompress; /* time of each block decompressed (zstd datasets) */
	void *priv;
};

/* A parsed Megatron .idx (offsets into the mapped file). */
struct sl__mmidx {
	enum sluice_dtype dtype;
	uint64_t nseq, ndoc;
	uint64_t lengths_off, pointers_off, docs_off;
};
/* Checks a whole .idx held in p[0..len); SLUICE_EFORMAT naming what is wrong. */
SL_HIDDEN int sl__mmidx_parse(const unsigned char *p, size_t len, struct sl__mmidx *ix);

/*
 * WebDataset's shard lists: pat's braces expanded as webdataset's
 * braceexpand does ("{a,b}", "{000000..000004}" zero-padded to the wider
 * bound, "{0..10..5}", "{a..e}"; a brace that is none of these is text),
 * into *out (n malloc'd strings, in order; free each and the array).
 * Returns 0, SLUICE_EINVAL_CONFIG past max names (naming pat), or -ENOMEM.
 */
SL_HIDDEN int sl__brace_expand(const char *pat, unsigned max, char ***out, unsigned *n);
/* WebDataset: scan a tar held in memory into a sidecar image (fuzzing, tests). */
SL_HIDDEN int sl__wds_scan_mem(const void *p, size_t len, unsigned char **out, size_t *out_len);
/*
 * What a sidecar index is the index of: the tar as it was when scanned.
 * A rewrite in place that keeps the size and restores the mtime (rsync -t,
 * cp -p, tar -x) still changes the ctime and often the inode; the
 * fingerprint (CRC32C of its first and last 4 KiB) catches the rest.
 */
struct sl__wds_stamp {
	uint64_t size, mtime_ns, ctime_ns, ino;
	uint32_t fingerprint;
};
/*
 * Checks a sidecar image against the tar's stamp: 0 valid, 1 stale,
 * SLUICE_EFORMAT malformed.  *skipped: the members the scan skipped.
 */
SL_HIDDEN int sl__wds_parse(const unsigned char *p, size_t len, const struct sl__wds_stamp *want, unsigned *nkeys,
			    char keys[][256], uint64_t *nsamples, size_t *entries_off, uint32_t *skipped);

SL_HIDDEN extern const struct sl__ds_ops sl__ds_native_ops;
SL_HIDDEN extern const struct sl__ds_ops sl__ds_wds_ops;
SL_HIDDEN extern const struct sl__ds_ops sl__ds_megatron_ops;
SL_HIDDEN extern const struct sl__ds_ops sl__ds_tfrecord_ops;
SL_HIDDEN extern const struct sl__ds_ops sl__ds_mds_ops;
SL_HIDDEN extern const struct sl__ds_ops sl__ds_litdata_ops;

/*
 * mds.c: what MDS shards and LitData chunks share, over untrusted bytes.
 * sl__offsets_parse: a shard's u32 count and count + 1 offsets (rising,
 * past the header, inside the len bytes at p) into off.  sl__cols_split: a
 * sample of n columns (size[c]: a fixed size, else the column's u32 size
 * leads the sample; want[c]: the size it must have, 0 any; unit[c]: its
 * element size, which the size must be a multiple of) into data and lens,
 * every column inside the sample and the sample used exactly; *bad: the
 * column at fault (n: none).  0 or SLUICE_EFORMAT saying what.
 */
struct sl__cols {
	unsigned n;
	uint32_t size[SLUICE_MAX_FIELDS], want[SLUICE_MAX_FIELDS], unit[SLUICE_MAX_FIELDS];
};
SL_HIDDEN int sl__offsets_parse(const unsigned char *p, size_t len, uint32_t *off);
SL_HIDDEN int sl__cols_split(const struct sl__cols *cols, const unsigned char *p, size_t len, const void **data,
			     size_t *lens, unsigned *bad);

/*
 * arrowipc.c: the Arrow IPC file (or stream) at p[0, n) (untrusted; base:
 * where it lies in its file, so that a batch's body is a file offset;
 * name: the file, for messages) of a flat table, as LitData's row footers
 * hold one: its columns (numbers, bools, strings and bytes; any other type
 * refused naming the column) and record batches (each's body and the
 * places of its buffers in it, checked to lie inside it).  Free with
 * sl__arrow_free.  sl__arrow_rows_len: batch k's rows' lengths as laid
 * out for records (LitData's items: every column's u32 size, then each
 * column's bytes, a bool one byte) into off[1..rows] from off[0], its body's bytes
 * at body (body_len of them) checked first: offsets, bounds, no null
 * (named by row).  sl__arrow_rows: the rows written so into dst (off[rows]
 * - off[0] bytes), each checked against off.  0, SLUICE_EFORMAT naming
 * what, or -ENOMEM.
 */
enum { SL_ACOL_FIXED, SL_ACOL_BOOL, SL_ACOL_VAR32, SL_ACOL_VAR64 };
enum { SL_ACODEC_NONE, SL_ACODEC_ZSTD };
/* A compressed buffer's declared length, at most (fuzzing: 16 MiB, so that no input asks for 4 GiB). */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define SL_ARROW_BUF_MAX (1ull << 24)
#else
#define SL_ARROW_BUF_MAX (1ull << 32)
#endif
struct sl__acol {
	char name[256];
	enum sluice_dtype dtype;
	int kind;       /* SL_ACOL_* */
	unsigned width; /* bytes of a value as laid out: the dtype's, 1 for a bool, 0 for a variable column */
};
struct sl__abuf {
	uint64_t off, len; /* in the batch's body, as stored */
};
struct sl__abatch {
	uint64_t body, body_len; /* the file offset of its body, and its bytes */
	uint64_t rows, first;    /* its rows, and the table's row it starts at */
	struct sl__abuf *buf;    /* each column's buffers in turn: 2 (validity, values) or 3 (validity, offsets, data) */
	uint64_t nulls;          /* bit c: column c has nulls here */
	int codec;               /* SL_ACODEC_*: its buffers' */
};
struct sl__arrow {
	unsigned ncols;
	struct sl__acol *col;
	uint64_t nbatches, rows;
	size_t cap;
	struct sl__abatch *b;
};
SL_HIDDEN int sl__arrow_parse(const unsigned char *p, size_t n, uint64_t base, struct sl__arrow *a, const char *name);
SL_HIDDEN void sl__arrow_free(struct sl__arrow *a);
SL_HIDDEN int sl__arrow_rows_len(const struct sl__arrow *a, uint64_t k, const unsigned char *body, uint64_t *off,
				 const char *name);
SL_HIDDEN int sl__arrow_rows(const struct sl__arrow *a, uint64_t k, const unsigned char *body, const uint64_t *off,
			     unsigned char *dst, const char *name);

/*
 * tfrecord.c: one TFRecord file's records (len bytes at p, untrusted; name
 * for messages) into a malloc'd table: where each record's data lies, its
 * length, and its data CRC unmasked (its CRC32C).  Every length's CRC and
 * bound is checked; SLUICE_EFORMAT names the file, the record and its
 * offset.  sl__tfr_unmask: TFRecord's masked CRC back to the CRC.
 */
struct sl__tfr_rec {
	uint64_t off;
	uint32_t len, crc;
};
SL_HIDDEN int sl__tfr_scan(const unsigned char *p, size_t len, const char *name, struct sl__tfr_rec **out,
			   uint64_t *n);
SL_HIDDEN uint32_t sl__tfr_unmask(uint32_t masked);
/* The generic layer: a file's descriptor (opened on first use). */
SL_HIDDEN int sl__ds_fd(struct sluice_dataset *ds, unsigned f);
/*
 * The path to open file f at, into path (cap bytes): its own, or for s3://
 * the cached copy (fetched on the first use, when the dataset's other
 * files start being fetched ahead; fetched again if the cache let it go).
 */
/*
 * What a loader will read this epoch: files[0, n) by shard id, in the
 * order it first uses them (a node's share).  A remote dataset then
 * fetches ahead those (as many as fit in the cache's limit, in that
 * order) instead of every file, and marks the cached copies of the others
 * the first to evict.  Local datasets ignore it.  0 or -ENOMEM.
 */
SL_HIDDEN int sl__ds_plan(struct sluice_dataset *ds, const unsigned *files, unsigned n);
SL_HIDDEN int sl__ds_path(struct sluice_dataset *ds, unsigned f, char *path, size_t cap);
/*
 * fn(id) is called by sluice_dataset_close() with the closing dataset's id,
 * so what the layers above keep of it (dsread's bound files) goes with it;
 * one fn for the process, set once by the layer that keeps something.
 */
SL_HIDDEN void sl__ds_on_close(void (*fn)(uint64_t id));
/*
 * Maps a whole file read-only; errors name the file (with enoent_hint, a
 * missing file is called an unfinished or foreign dataset).  munmap() it.
 */
SL_HIDDEN int sl__map_ro(const char *path, const unsigned char **map, size_t *len, int enoent_hint);
/* The same of the dataset's file f, through sl__ds_path: a remote file's copy pinned to the version it reads. */
SL_HIDDEN int sl__ds_map(struct sluice_dataset *ds, unsigned f, const unsigned char **map, size_t *len);
/* Reads n bytes at off of file f; errors name the file and "what which" (e.g. record 7). */
SL_HIDDEN int sl__ds_pread(struct sluice_dataset *ds, unsigned f, void *buf, size_t n, uint64_t off,
			   const char *what, uint64_t which);
/*
 * native.c: decodes zstd block b (its index k) of shard into dst (b->len
 * bytes) with dc: its stored bytes from src, or with src NULL read from the
 * shard's file into *scratch (grown to fit, *cap bytes).  0, or
 * SLUICE_EFORMAT / -errno naming the file and the block.  The one zstd
 * decoder of records (native.c) and of whole shards (dsread/shard.c).
 */
struct ZSTD_DCtx_s;
SL_HIDDEN int sl__zblock_decode(struct sluice_dataset *ds, struct ZSTD_DCtx_s *dc, unsigned shard, uint64_t k,
				const struct sl__block *b, const void *src, char **scratch, size_t *cap, void *dst);
/* SLUICE_EFORMAT naming record i unless loc lies inside the bytes its file holds. */
SL_HIDDEN int sl__ds_loc_check(const struct sluice_dataset *ds, uint64_t i, const struct sluice_record_loc *loc);
/* Sets up files/fds arrays for n files; names are taken over. */
SL_HIDDEN int sl__ds_files(struct sluice_dataset *ds, char **names, unsigned n);
/* The file holding record i, first[f] being file f's first record (nfiles >= 1, first rising). */
SL_HIDDEN unsigned sl__ds_file_of(const uint64_t *first, unsigned nfiles, uint64_t i);

/* npy.c: a .npy header held in p[0..len); SLUICE_EFORMAT naming what is wrong. */
SL_HIDDEN int sl__npy_parse(const unsigned char *p, size_t len, enum sluice_dtype *dtype, uint64_t *count,
			    uint64_t *data_off);
/* json.c: one JSON line as values of fields f (bytes in *scratch). */
SL_HIDDEN int sl__json_values(const struct sluice_field *f, unsigned n, const char *line, size_t len,
			      unsigned char **scratch, size_t *cap, const void **vals, size_t *lens);

/* Record bytes: size of the encoding, encoder, and decoder (bounds-checked). */
SL_HIDDEN size_t sl__record_size(unsigned nfields, const size_t *lens);
SL_HIDDEN void sl__record_encode(unsigned char *out, unsigned nfields, const void *const *vals,
				 const size_t *lens);
SL_HIDDEN int sl__record_decode(const struct sluice_field *f, unsigned nfields,
				const unsigned char *p, size_t len, struct sluice_record *rec);

/* The importers' own (src/pack): */
/*
 * JSON lines.  sl__json_schema() infers fields from one JSON object:
 * the top-level keys names[0..n) become fields named after them (out[i].name
 * points to names[i]): string -> bytes, integer -> i64, real -> f64,
 * boolean -> u8, array of integers -> i64[*], array of numbers -> f32[*],
 * anything else -> bytes holding its JSON text.  sl__writer_add_json()
 * adds one line (line lineno of the file from) as a record of w's schema.
 * Both return 0 or SLUICE_EFORMAT naming the field (invalid JSON, a missing
 * or null key, a type that differs from the schema, a number past its
 * type's range), sl__writer_add_json() naming from:lineno too; or, from
 * sl__writer_add_json(), the writer's error, naming the output.
 */
SL_HIDDEN int sl__json_schema(const char *line, size_t len, const char *const *names, unsigned n,
					     struct sluice_field *out);
SL_HIDDEN int sl__writer_add_json(struct sluice_writer *w, const char *line, size_t len, const char *from,
				  uint64_t lineno);
/*
 * Lines of a stream, each held whole but never one longer than max bytes
 * (SLUICE_MAX_RECORD), so that a file without newlines (a JSON array,
 * /dev/zero) cannot grow the process without end.  sl__lines_next: 1 and
 * the next line (without its '\n', valid until the next call), 0 at the
 * end, or an error: SLUICE_EFORMAT for a line longer than max, -ENOMEM,
 * or the read's -errno (never taken for the end).  lineno is the number of
 * the line returned, or of the one that failed; the caller names the file.  Free with sl__lines_free.
 */
struct sl__lines {
	FILE *f;
	size_t max;
	char *buf;
	size_t cap, start, scan, end; /* buf[start, end) unread; no '\n' in buf[start, scan) */
	uint64_t lineno;
	int eof;
};
SL_HIDDEN int sl__lines_next(struct sl__lines *r, const char **line, size_t *len);
SL_HIDDEN void sl__lines_free(struct sl__lines *r);

/*
 * Reads the header of a NumPy .npy file holding a one-dimensional,
 * C-order, little-endian array of a sluice dtype.  Returns 0 with the
 * dtype, element count and the byte offset of the data; SLUICE_EFORMAT
 * (detail names the file and the problem) or -errno.
 */
SL_HIDDEN int sl__npy_header(const char *path, enum sluice_dtype *dtype, uint64_t *count,
					    uint64_t *data_offset);


/*
 * A safetensors file's header (safetensors.c): its tensors in offset
 * order, each [begin, end) relative to the data, which starts at
 * data_start.  sl__st_parse checks head (the file's first len bytes; the
 * whole header must be in them) against the file's size; SLUICE_EFORMAT
 * naming path and what is wrong.
 */
#define SL_ST_HEADER_MAX (100ull << 20)
#define SL_ST_MAX_DIMS 64
struct sl__st_dtype {
	const char *name; /* safetensors' */
	unsigned bits;    /* per element */
	const char *torch; /* torch's dtype name, or NULL: none */
};
SL_HIDDEN extern const struct sl__st_dtype sl__st_dtypes[];
/* The index in sl__st_dtypes of a safetensors dtype name (or, with torch_name, a torch one), or -1. */
SL_HIDDEN int sl__st_dtype_find(const char *name, int torch_name);
struct sl__st_tensor {
	char *name;
	int dtype; /* index in sl__st_dtypes */
	unsigned ndim;
	uint64_t *shape;
	uint64_t begin, end;
};
struct sl__st_header {
	struct sl__st_tensor *t;
	size_t n;
	uint64_t data_start;
};
SL_HIDDEN int sl__st_parse(const char *head, size_t len, uint64_t file_size, const char *path,
			   struct sl__st_header *out);
SL_HIDDEN void sl__st_free(struct sl__st_header *h);
/*
 * A sharded checkpoint's index (model.safetensors.index.json, safetensors.c):
 * {"metadata": {...} or null, "weight_map": {tensor: file}}, as Hugging Face's
 * tools write it.  names[i] (sorted) is placed in files[file[i]]; files are
 * sorted, each once, each a plain name beside the index (no separator, no dot
 * segment, no '%', no control character).  sl__st_index_parse: 0, or
 * SLUICE_EFORMAT naming path and what is wrong, or -ENOMEM.
 */
struct sl__st_index {
	char **names;
	unsigned *file;
	size_t n;
	char **files;
	size_t nfiles;
};
SL_HIDDEN int sl__st_index_parse(const char *raw, size_t len, const char *path, struct sl__st_index *out);
SL_HIDDEN void sl__st_index_free(struct sl__st_index *ix);
/* The index in ix->names of a tensor's name, or -1. */
SL_HIDDEN long sl__st_index_find(const struct sl__st_index *ix, const char *name);

/*
 * The metadata sluice.dcp's StorageWriter writes (.metadata, dcp.c): its
 * notice, then JSON checked whole (tensors and their chunks, bytes, items
 * stored once each under the writer's names, in files of one save).  0 and
 * *doc (the document, json_decref to free), or SLUICE_EFORMAT naming path.
 */
struct json_t;
SL_HIDDEN int sl__dcp_meta_parse(const char *raw, size_t len, const char *path, struct json_t **doc);

#endif
