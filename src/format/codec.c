/*
 * Encoding and checked decoding of records, shard headers, schemas and
 * index headers.  Every decoder trusts nothing it reads.
 */
#include <errno.h>
#include <stdlib.h>

#include "format/format.h"

static const unsigned char sl_dsize[] = { 1, 1, 2, 4, 4, 8, 2, 2, 4, 1, 2, 8 };
static const char *const sl_dname[] = { "bytes", "u8", "u16", "u32", "i32", "i64", "f16", "bf16", "f32", "i8", "i16", "f64" };

size_t sluice_dtype_size(enum sluice_dtype d)
{
	return (unsigned)d < sizeof(sl_dsize) ? sl_dsize[d] : 0;
}

const char *sluice_dtype_name(enum sluice_dtype d)
{
	return (unsigned)d < sizeof(sl_dsize) ? sl_dname[d] : NULL;
}

size_t sl__field_fixed_size(const struct sluice_field *f)
{
	size_t n = sluice_dtype_size(f->dtype);

	if (f->dtype == SLUICE_DTYPE_BYTES)
		return 0;
	for (int d = 0; d < f->ndim; d++) {
		if (f->shape[d] < 0)
			return 0;
		n *= (size_t)f->shape[d];
	}
	return n;
}

int sl__schema_check(const struct sluice_field *f, unsigned n)
{
	if (n < 1 || n > SLUICE_MAX_FIELDS)
		return sl__err(SLUICE_EINVAL_CONFIG, "%u fields: a dataset has 1 to %d", n, SLUICE_MAX_FIELDS);
	for (unsigned i = 0; i < n; i++) {
		size_t l = f[i].name ? strlen(f[i].name) : 0;

		if (l < 1 || l > 255 || strchr(f[i].name, '/'))
			return sl__err(SLUICE_EINVAL_CONFIG, "field %u: name must be 1-255 bytes without '/'", i);
		if (!sluice_dtype_name(f[i].dtype))
			return sl__err(SLUICE_EINVAL_CONFIG, "field '%s': unknown dtype %d", f[i].name, f[i].dtype);
		if (f[i].ndim < 0 || f[i].ndim > SLUICE_MAX_NDIM || (f[i].dtype == SLUICE_DTYPE_BYTES && f[i].ndim))
			return sl__err(SLUICE_EINVAL_CONFIG, "field '%s': bad ndim %d", f[i].name, f[i].ndim);
		for (int d = 0; d < f[i].ndim; d++)
			if (f[i].shape[d] == 0 || f[i].shape[d] < -1 || f[i].shape[d] > (1ll << 40))
				return sl__err(SLUICE_EINVAL_CONFIG, "field '%s': bad shape[%d] %lld", f[i].name, d,
					       (long long)f[i].shape[d]);
		for (unsigned j = 0; j < i; j++)
			if (!strcmp(f[i].name, f[j].name))
				return sl__err(SLUICE_EINVAL_CONFIG, "field '%s' appears twice", f[i].name);
	}
	return 0;
}

/* ---- records ---- */

static size_t sl_pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

size_t sl__record_size(unsigned nfields, const size_t *lens)
{
	size_t n = sl_pad8(4 * (size_t)nfields);

	for (unsigned i = 0; i < nfields; i++)
		n += sl_pad8(lens[i]);
	return n;
}

void sl__record_encode(unsigned char *out, unsigned nfields, const void *const *vals, const size_t *lens)
{
	size_t off = sl_pad8(4 * (size_t)nfields);

	memset(out, 0, off);
	for (unsigned i = 0; i < nfields; i++) {
		sl__put32(out + 4 * i, (uint32_t)lens[i]);
		if (lens[i]) /* an empty value may be NULL (sluice_writer_add allows it), and memcpy's may not */
			memcpy(out + off, vals[i], lens[i]);
		memset(out + off + lens[i], 0, sl_pad8(lens[i]) - lens[i]);
		off += sl_pad8(lens[i]);
	}
}

int sl__record_decode(const struct sluice_field *f, unsigned nfields, const unsigned char *p, size_t len,
		      struct sluice_record *rec)
{
	size_t off = sl_pad8(4 * (size_t)nfields);

	if (len < off)
		return sl__err(SLUICE_EFORMAT, "record of %zu bytes is shorter than its field table", len);
	for (unsigned i = 0; i < nfields; i++) {
		size_t l = sl__le32(p + 4 * i), fixed = sl__field_fixed_size(&f[i]), es = sluice_dtype_size(f[i].dtype);

		if (l > len - off || sl_pad8(l) > len - off)
			return sl__err(SLUICE_EFORMAT, "field '%s' (%zu bytes) runs past the record (%zu bytes)",
				       f[i].name, l, len);
		if ((fixed && l != fixed) || l % es)
			return sl__err(SLUICE_EFORMAT, "field '%s' has %zu bytes, not a valid size for %s%s", f[i].name,
				       l, sluice_dtype_name(f[i].dtype), fixed ? " of fixed shape" : "");
		if (rec) {
			rec->data[i] = p + off;
			rec->len[i] = l;
		}
		off += sl_pad8(l);
	}
	if (off != len)
		return sl__err(SLUICE_EFORMAT, "record has %zu bytes after its last field", len - off);
	return 0;
}

/* ---- shard header ---- */

void sl__shard_header(unsigned char *h, const struct sl__shard_hdr *sh)
{
	memset(h, 0, SL_HDR_SIZE);
	memcpy(h, SL_SHARD_MAGIC, 8);
	sl__put32(h + 8, SL_FORMAT_VERSION);
	sl__put32(h + 12, sh->shard);
	sl__put64(h + 16, sh->nrecords);
	sl__put64(h + 24, sh->data_len);
	sl__put32(h + 32, sluice_crc32c(0, h, 32));
	if (sh->flags & SL_FLAG_ZSTD) {
		sl__put32(h + 36, sh->flags);
		sl__put64(h + 40, sh->table_off);
		sl__put64(h + 48, sh->nblocks);
		sl__put32(h + 56, sh->table_crc);
		sl__put32(h + 60, sluice_crc32c(0, h + 36, 24));
	}
}

int sl__shard_header_parse(const unsigned char *h, size_t len, struct sl__shard_hdr *sh)
{
	memset(sh, 0, sizeof(*sh));
	if (len < 64)
		return sl__err(SLUICE_EFORMAT, "shard header truncated (%zu bytes)", len);
	if (memcmp(h, SL_SHARD_MAGIC, 8))
		return sl__err(SLUICE_EFORMAT, "not a sluice shard (bad magic)");
	/* Shards are the same in versions 1 and 2 (version 2 changed the index); writers before it wrote 1. */
	if (sl__le32(h + 8) < 1 || sl__le32(h + 8) > SL_FORMAT_VERSION)
		return sl__err(SLUICE_EFORMAT, "shard version %u, this sluice reads 1 to %u", sl__le32(h + 8),
			       SL_FORMAT_VERSION);
	if (SL_CRC_BAD(sl__le32(h + 32), sluice_crc32c(0, h, 32)))
		return sl__err(SLUICE_EFORMAT, "shard header CRC mismatch");
	sh->shard = sl__le32(h + 12);
	sh->nrecords = sl__le64(h + 16);
	sh->data_len = sl__le64(h + 24);
	sh->flags = sl__le32(h + 36);
	if (sh->flags & ~(SL_FLAG_ZSTD | SL_FLAG_BLOCK_CRC) || sh->flags == SL_FLAG_BLOCK_CRC)
		return sl__err(SLUICE_EFORMAT, "shard flags 0x%x unknown to this sluice", sh->flags);
	if (!sh->flags)
		return 0;
	if (SL_CRC_BAD(sl__le32(h + 60), sluice_crc32c(0, h + 36, 24)))
		return sl__err(SLUICE_EFORMAT, "shard block header CRC mismatch");
	sh->table_off = sl__le64(h + 40);
	sh->nblocks = sl__le64(h + 48);
	sh->table_crc = sl__le32(h + 56);
	if (sh->table_off < SL_HDR_SIZE || sh->table_off % SL_ALIGN || sh->data_len > SL_MAX_SHARD_BYTES ||
	    sh->nblocks > sh->data_len || (sh->data_len && !sh->nblocks))
		return sl__err(SLUICE_EFORMAT, "shard block table out of place (%llu blocks at %llu)",
			       (unsigned long long)sh->nblocks, (unsigned long long)sh->table_off);
	return 0;
}

int sl__blocks_parse(const unsigned char *p, size_t len, const struct sl__shard_hdr *sh, struct sl__block *b)
{
	uint64_t logical = SL_HDR_SIZE, file = SL_HDR_SIZE;

	const int crcs = !!(sh->flags & SL_FLAG_BLOCK_CRC);

	if (sh->nblocks > len / (SL_BLOCK_ENTRY + 4u * crcs))
		return sl__err(SLUICE_EFORMAT, "block table truncated: %llu blocks in %zu bytes",
			       (unsigned long long)sh->nblocks, len);
	if (SL_CRC_BAD(sh->table_crc, sluice_crc32c(0, p, sl__block_table_len(sh))))
		return sl__err(SLUICE_EFORMAT, "block table CRC mismatch");
	for (uint64_t k = 0; k < sh->nblocks; k++) {
		const unsigned char *e = p + SL_BLOCK_ENTRY * k;

		b[k].logical = sl__le64(e);
		b[k].file = sl__le64(e + 8);
		b[k].stored = sl__le32(e + 16);
		b[k].len = sl__le32(e + 20);
		b[k].crc = crcs ? sl__le32(p + SL_BLOCK_ENTRY * sh->nblocks + 4 * k) : 0;
		b[k].has_crc = (uint32_t)crcs;
		/* Blocks tile the logical data in order, and lie in order between header and table. */
		if (b[k].logical != logical || !b[k].len || b[k].len > sh->data_len + SL_HDR_SIZE - logical ||
		    b[k].file < file || b[k].file % SL_ALIGN || !b[k].stored || b[k].stored > sh->table_off ||
		    b[k].file > sh->table_off - b[k].stored)
			return sl__err(SLUICE_EFORMAT, "block %llu is out of place", (unsigned long long)k);
		logical += b[k].len;
		file = b[k].file + b[k].stored;
	}
	if (logical != SL_HDR_SIZE + sh->data_len)
		return sl__err(SLUICE_EFORMAT, "blocks hold %llu bytes, the shard %llu",
			       (unsigned long long)(logical - SL_HDR_SIZE), (unsigned long long)sh->data_len);
	return 0;
}

/* ---- index ---- */

int sl__index_build(const struct sluice_field *f, unsigned nfields, uint64_t nrecords, const uint32_t *group_crc,
		    const char *meta, const uint64_t *shard_records, const uint64_t *shard_bytes, unsigned nshards,
		    uint32_t flags, unsigned char **out, size_t *out_len)
{
	const uint64_t ngroups = (nrecords + SL_EGROUP - 1) / SL_EGROUP;
	const size_t meta_len = meta ? strlen(meta) : 0;
	size_t schema = 0, shards_off, end;
	unsigned char *b, *q;
	uint32_t crc;

	for (unsigned i = 0; i < nfields; i++)
		schema += sl_pad8(4 + 8 * (size_t)f[i].ndim + strlen(f[i].name));
	shards_off = SL_HDR_SIZE + schema;
	end = shards_off + 16 * (size_t)nshards + 4 * (size_t)ngroups + meta_len;
	b = calloc(1, sl__align_up(end, SL_HDR_SIZE));
	if (!b)
		return -ENOMEM;
	q = b + SL_HDR_SIZE;
	for (unsigned i = 0; i < nfields; i++) {
		size_t l = strlen(f[i].name);

		q[0] = (unsigned char)f[i].dtype;
		q[1] = (unsigned char)f[i].ndim;
		q[2] = (unsigned char)l;
		q[3] = 0;
		for (int d = 0; d < f[i].ndim; d++)
			sl__put64(q + 4 + 8 * d, (uint64_t)f[i].shape[d]);
		memcpy(q + 4 + 8 * f[i].ndim, f[i].name, l);
		q += sl_pad8(4 + 8 * (size_t)f[i].ndim + l);
	}
	for (unsigned s = 0; s < nshards; s++) {
		sl__put64(b + shards_off + 16 * s, shard_records[s]);
		sl__put64(b + shards_off + 16 * s + 8, shard_bytes[s]);
	}
	for (uint64_t g = 0; g < ngroups; g++)
		sl__put32(b + shards_off + 16 * (size_t)nshards + 4 * g, group_crc[g]);
	if (meta_len)
		memcpy(b + end - meta_len, meta, meta_len);
	sl__put64(b + 72, meta_len);
	sl__put32(b + 80, sluice_crc32c(0, b + 72, 8));
	memcpy(b, SL_INDEX_MAGIC, 8);
	sl__put32(b + 8, SL_FORMAT_VERSION);
	sl__put32(b + 12, nfields);
	sl__put64(b + 16, nrecords);
	sl__put32(b + 24, nshards);
	sl__put32(b + 28, flags);
	sl__put64(b + 32, SL_HDR_SIZE);
	sl__put64(b + 40, schema);
	sl__put64(b + 48, shards_off);
	sl__put64(b + 56, sl__align_up(end, SL_HDR_SIZE));
	crc = sluice_crc32c(0, b + SL_HDR_SIZE, end - SL_HDR_SIZE);
	sl__put32(b + 64, crc);
	sl__put32(b + 68, sluice_crc32c(0, b, 68));
	*out = b;
	*out_len = sl__align_up(end, SL_HDR_SIZE);
	return 0;
}

void sl__index_free(struct sl__index *ix)
{
	free(ix->shard_records);
	free(ix->shard_bytes);
	free(ix->shard_first);
	ix->shard_records = ix->shard_bytes = ix->shard_first = NULL;
}

/* The header: magic, version, CRCs, counts, and the sections where they belong in a file of file_size. */
static int sl_index_header(const unsigned char *p, size_t len, uint64_t file_size, struct sl__index *ix)
{
	if (len < 72)
		return sl__err(SLUICE_EFORMAT, "index header truncated (%zu bytes)", len);
	if (memcmp(p, SL_INDEX_MAGIC, 8))
		return sl__err(SLUICE_EFORMAT, "not a sluice index (bad magic)");
	ix->version = sl__le32(p + 8);
	if (ix->version < 1 || ix->version > SL_FORMAT_VERSION)
		return sl__err(SLUICE_EFORMAT, "index version %u, this sluice reads 1 to %u", ix->version,
			       SL_FORMAT_VERSION);
	if (SL_CRC_BAD(sl__le32(p + 68), sluice_crc32c(0, p, 68)))
		return sl__err(SLUICE_EFORMAT, "index header CRC mismatch");
	ix->nfields = sl__le32(p + 12);
	ix->nrecords = sl__le64(p + 16);
	ix->nshards = sl__le32(p + 24);
	ix->schema_off = sl__le64(p + 32);
	ix->schema_len = sl__le64(p + 40);
	ix->shards_off = sl__le64(p + 48);
	ix->entries_off = sl__le64(p + 56);
	ix->flags = sl__le32(p + 28);
	if (ix->flags & ~SL_FLAG_ZSTD)
		return sl__err(SLUICE_EFORMAT, "index flags 0x%x unknown to this sluice", ix->flags);
	if (ix->nfields < 1 || ix->nfields > SLUICE_MAX_FIELDS)
		return sl__err(SLUICE_EFORMAT, "index declares %u fields", ix->nfields);
	if (ix->nshards < 1 || ix->nshards > SL_MAX_SHARDS)
		return sl__err(SLUICE_EFORMAT, "index declares %u shards", ix->nshards);
	/* Version 2: a CRC per group of entries follows the shard table. */
	ix->ngroups = ix->version >= 2 ? (ix->nrecords + SL_EGROUP - 1) / SL_EGROUP : 0;
	ix->groups_off = ix->shards_off + 16 * (uint64_t)ix->nshards;
	/* And then the metadata, its length at 72 under a CRC of its own at 80. */
	ix->meta_off = ix->groups_off + 4 * ix->ngroups;
	ix->meta_len = 0;
	if (ix->version >= 2) {
		if (len < 84)
			return sl__err(SLUICE_EFORMAT, "index header truncated (%zu bytes)", len);
		if (SL_CRC_BAD(sl__le32(p + 80), sluice_crc32c(0, p + 72, 8)))
			return sl__err(SLUICE_EFORMAT, "index header CRC mismatch (metadata length)");
		ix->meta_len = sl__le64(p + 72);
		if (ix->meta_len > SL_META_MAX)
			return sl__err(SLUICE_EFORMAT, "index declares %llu bytes of metadata", (unsigned long long)ix->meta_len);
	}
	if (ix->schema_off != SL_HDR_SIZE || ix->schema_len > (1u << 20) ||
	    ix->shards_off != ix->schema_off + ix->schema_len || ix->nrecords > UINT64_MAX / 2 ||
	    ix->entries_off < ix->meta_off + ix->meta_len || ix->entries_off % SL_HDR_SIZE)
		return sl__err(SLUICE_EFORMAT, "index sections out of place");
	if (file_size < ix->entries_off || ix->nrecords > (file_size - ix->entries_off) / SL_ENTRY ||
	    ix->entries_off + SL_ENTRY * ix->nrecords != file_size)
		return sl__err(SLUICE_EFORMAT, "index holds %llu bytes, %llu records need %llu",
			       (unsigned long long)file_size, (unsigned long long)ix->nrecords,
			       (unsigned long long)(ix->entries_off + SL_ENTRY * ix->nrecords));
	if (len < ix->meta_off + ix->meta_len)
		return sl__err(SLUICE_EFORMAT, "index truncated before its shard table");
	if (SL_CRC_BAD(sl__le32(p + 64), sluice_crc32c(0, p + ix->schema_off, ix->meta_off + ix->meta_len - ix->schema_off)))
		return sl__err(SLUICE_EFORMAT, "index schema or shard table CRC mismatch");
	if (memchr(p + ix->meta_off, 0, ix->meta_len))
		return sl__err(SLUICE_EFORMAT, "index metadata holds a NUL byte");
	return 0;
}

/* The schema: each field's dtype, shape and name, as long as the header says, and valid together. */
static int sl_index_schema(const unsigned char *p, struct sl__index *ix)
{
	const unsigned char *q, *end;

	q = p + ix->schema_off;
	end = q + ix->schema_len;
	for (unsigned i = 0; i < ix->nfields; i++) {
		struct sluice_field *f = &ix->fields[i];
		size_t l, sz;

		if (end - q < 4)
			return sl__err(SLUICE_EFORMAT, "schema truncated at field %u", i);
		f->dtype = (enum sluice_dtype)q[0];
		f->ndim = q[1];
		l = q[2] | (size_t)q[3] << 8;
		sz = sl_pad8(4 + 8 * (size_t)f->ndim + l);
		if (f->ndim > SLUICE_MAX_NDIM || l < 1 || l > 255 || (size_t)(end - q) < sz)
			return sl__err(SLUICE_EFORMAT, "schema field %u malformed", i);
		for (int d = 0; d < f->ndim; d++)
			f->shape[d] = (int64_t)sl__le64(q + 4 + 8 * d);
		memcpy(ix->names[i], q + 4 + 8 * f->ndim, l);
		ix->names[i][l] = '\0';
		if (strlen(ix->names[i]) != l)
			return sl__err(SLUICE_EFORMAT, "schema field %u name holds a NUL byte", i);
		f->name = ix->names[i];
		q += sz;
	}
	if (q != end)
		return sl__err(SLUICE_EFORMAT, "schema has %zu bytes after its last field", (size_t)(end - q));
	if (sl__schema_check(ix->fields, ix->nfields))
		return sl__err(SLUICE_EFORMAT, "schema invalid: %s", sluice_last_error_detail());
	return 0;
}

/* The shard table: each shard's records and bytes, adding up to the index's records. */
static int sl_index_shards(const unsigned char *p, struct sl__index *ix)
{
	uint64_t first = 0;

	ix->shard_records = malloc(ix->nshards * sizeof(uint64_t));
	ix->shard_bytes = malloc(ix->nshards * sizeof(uint64_t));
	ix->shard_first = malloc(ix->nshards * sizeof(uint64_t));
	if (!ix->shard_records || !ix->shard_bytes || !ix->shard_first) {
		return -ENOMEM;
	}
	for (unsigned s = 0; s < ix->nshards; s++) {
		ix->shard_records[s] = sl__le64(p + ix->shards_off + 16 * s);
		ix->shard_bytes[s] = sl__le64(p + ix->shards_off + 16 * s + 8);
		ix->shard_first[s] = first;
		if (ix->shard_records[s] > ix->nrecords - first || ix->shard_bytes[s] > SL_MAX_SHARD_BYTES) {
			return sl__err(SLUICE_EFORMAT, "shard table entry %u is out of range", s);
		}
		first += ix->shard_records[s];
	}
	if (first != ix->nrecords) {
		return sl__err(SLUICE_EFORMAT, "shard table holds %llu records, the index %llu", (unsigned long long)first,
			       (unsigned long long)ix->nrecords);
	}
	return 0;
}

int sl__index_parse(const unsigned char *p, size_t len, uint64_t file_size, struct sl__index *ix)
{
	int rc;

	memset(ix, 0, sizeof(*ix));
	if ((rc = sl_index_header(p, len, file_size, ix)) || (rc = sl_index_schema(p, ix)))
		return rc;
	if ((rc = sl_index_shards(p, ix)))
		sl__index_free(ix);
	return rc;
}
