/*
 * format: sluice's dataset files (docs/FORMAT.md).  Parsers here take
 * bytes from outside and MUST bound every read by the length they are
 * given; fuzz targets in tests/fuzz feed them directly.  Depends on core
 * only (never on gpu/).
 */
#ifndef SL_FORMAT_H
#define SL_FORMAT_H

#include <string.h>

#include "core/core.h"

#define SL_SHARD_MAGIC "SLUICESH"
#define SL_INDEX_MAGIC "SLUICEIX"
#define SL_FORMAT_VERSION 1
#define SL_HDR_SIZE 4096u
#define SL_INDEX_NAME "index.sli"
#define SL_MAX_SHARDS 65535u
#define SL_LOC_SHIFT 48

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
	uint32_t nfields, nshards;
	uint64_t nrecords;
	uint64_t schema_off, schema_len, shards_off, entries_off;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	char names[SLUICE_MAX_FIELDS][256];
	uint64_t *shard_records; /* nshards each; malloc'd */
	uint64_t *shard_bytes;
};

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
/* Serialises schema and shard table behind a 4 KiB header; returns malloc'd bytes and size. */
SL_HIDDEN int sl__index_build(const struct sluice_field *f, unsigned nfields, uint64_t nrecords,
			      const uint64_t *shard_records, const uint64_t *shard_bytes,
			      unsigned nshards, unsigned char **out, size_t *out_len);

/* Shard header: encode into 4096 bytes; parse and check. */
SL_HIDDEN void sl__shard_header(unsigned char *h, uint32_t shard, uint64_t nrecords,
				uint64_t data_len);
SL_HIDDEN int sl__shard_header_parse(const unsigned char *h, size_t len, uint32_t *shard,
				     uint64_t *nrecords, uint64_t *data_len);

/* Record bytes: size of the encoding, encoder, and decoder (bounds-checked). */
SL_HIDDEN size_t sl__record_size(unsigned nfields, const size_t *lens);
SL_HIDDEN void sl__record_encode(unsigned char *out, unsigned nfields, const void *const *vals,
				 const size_t *lens);
SL_HIDDEN int sl__record_decode(const struct sluice_field *f, unsigned nfields,
				const unsigned char *p, size_t len, struct sluice_record *rec);

#endif
