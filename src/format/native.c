/*
 * Reader of sluice's own format (docs/FORMAT.md): the index is mapped and
 * checked in O(fields + shards); entries are read on demand.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "format/format.h"

/*
 * zstd shards: the blocks last decompressed, each in a cache entry, so that readers
 * walking different parts of the dataset (a loader's reader threads) keep
 * their own block and decompress in parallel, outside the lock.
 */
#define SL_ZCACHED 4
enum { SL_Z_EMPTY = 0, SL_Z_LOADING, SL_Z_READY };

struct sl_zcached {
	int state;
	unsigned users;            /* callers copying out of buf, or loading it */
	unsigned shard;
	uint64_t block;
	uint64_t used;             /* tick of the last use: the least recent goes first */
	ZSTD_DCtx *dctx;
	char *zbuf;
	unsigned char *buf;
	size_t zcap, cap;
};

struct sl_native {
	struct sl__index ix;
	const unsigned char *map; /* the whole index file */
	size_t map_len;
	pthread_mutex_t lock;      /* block tables and the cache entries' states */
	pthread_cond_t cv;         /* an entry finished loading or was let go */
	struct sl__block **blocks; /* per shard, NULL until loaded */
	uint64_t *nblocks;
	struct sl_zcached z[SL_ZCACHED];
	uint64_t tick;
	_Atomic unsigned char *group_ok; /* version 2: each group of entries, 1 once it matched its CRC */
	char *index_path;
};

static int sl_native_probe(const char *path)
{
	char p[4096];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", path, SL_INDEX_NAME);
	return sl__fs_stat(p, &st) == 0;
}

/* The schema and the metadata, from the index into the dataset. */
static int sl_native_schema(struct sluice_dataset *ds, struct sl_native *nv)
{
	ds->nrecords = nv->ix.nrecords;
	ds->nfields = nv->ix.nfields;
	if (nv->ix.meta_len) {
		if (!(ds->metadata = malloc(nv->ix.meta_len + 1)))
			return -ENOMEM;
		memcpy(ds->metadata, nv->map + nv->ix.meta_off, nv->ix.meta_len);
		ds->metadata[nv->ix.meta_len] = 0;
	}
	for (unsigned f = 0; f < ds->nfields; f++) {
		ds->fields[f] = nv->ix.fields[f];
		memcpy(ds->names[f], nv->ix.names[f], sizeof(ds->names[f]));
		ds->fields[f].name = ds->names[f];
	}
	ds->has_crc = 1;
	return 0;
}

/* zstd shards: the block tables (loaded on first use) and a decompression context per cache entry. */
static int sl_native_zstd(struct sluice_dataset *ds, struct sl_native *nv)
{
	ds->compressed = 1;
	nv->blocks = calloc(nv->ix.nshards, sizeof(*nv->blocks));
	nv->nblocks = calloc(nv->ix.nshards, sizeof(*nv->nblocks));
	if (!nv->blocks || !nv->nblocks)
		return -ENOMEM;
	for (unsigned k = 0; k < SL_ZCACHED; k++)
		if (!(nv->z[k].dctx = ZSTD_createDCtx()))
			return -ENOMEM;
	return 0;
}

/* The shard files, their records and bytes as the index has them. */
static int sl_native_shards(struct sluice_dataset *ds, struct sl_native *nv, const char *path)
{
	char **names = calloc(nv->ix.nshards, sizeof(char *));
	int rc = names ? 0 : -ENOMEM;

	for (unsigned s = 0; !rc && s < nv->ix.nshards; s++)
		if (asprintf(&names[s], "%s/shard-%06u.sls", path, s) < 0)
			names[s] = NULL, rc = -ENOMEM;
	if (rc) {
		for (unsigned s = 0; names && s < nv->ix.nshards; s++)
			free(names[s]);
		free(names);
		return rc;
	}
	rc = sl__ds_files(ds, names, nv->ix.nshards);
	ds->file_records = malloc(nv->ix.nshards * sizeof(uint64_t));
	if (!rc && !ds->file_records)
		rc = -ENOMEM;
	for (unsigned s = 0; !rc && s < nv->ix.nshards; s++) {
		ds->file_bytes[s] = SL_HDR_SIZE + nv->ix.shard_bytes[s];
		ds->file_records[s] = nv->ix.shard_records[s];
	}
	return rc;
}

static int sl_native_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_native *nv = calloc(1, sizeof(*nv));
	int rc;

	if (!nv || asprintf(&nv->index_path, "%s/%s", path, SL_INDEX_NAME) < 0) {
		free(nv);
		return -ENOMEM;
	}
	ds->priv = nv;
	pthread_mutex_init(&nv->lock, NULL);
	pthread_cond_init(&nv->cv, NULL);
	if ((rc = sl__map_ro(nv->index_path, &nv->map, &nv->map_len, 1)))
		return rc;
	if ((rc = sl__index_parse(nv->map, nv->map_len, nv->map_len, &nv->ix)))
		return sl__err(rc, "%s: %s", nv->index_path, sluice_last_error_detail());
	/*
	 * Loaders touch entries in shuffled order: no readahead around them,
	 * so only the pages of records actually looked up become resident.
	 */
	if (nv->map_len > nv->ix.entries_off)
		madvise((void *)(nv->map + nv->ix.entries_off), nv->map_len - nv->ix.entries_off, MADV_RANDOM);
	if (nv->ix.ngroups && !(nv->group_ok = calloc(nv->ix.ngroups, 1)))
		return -ENOMEM;
	if ((rc = sl_native_schema(ds, nv)) || ((nv->ix.flags & SL_FLAG_ZSTD) && (rc = sl_native_zstd(ds, nv))))
		return rc;
	return sl_native_shards(ds, nv, path);
}

static void sl_native_close(struct sluice_dataset *ds)
{
	struct sl_native *nv = ds->priv;

	if (!nv)
		return;
	if (nv->map)
		munmap((void *)nv->map, nv->map_len);
	free((void *)nv->group_ok);
	free(nv->index_path);
	for (unsigned s = 0; nv->blocks && s < nv->ix.nshards; s++)
		free(nv->blocks[s]);
	free(nv->blocks);
	free(nv->nblocks);
	for (unsigned k = 0; k < SL_ZCACHED; k++) {
		ZSTD_freeDCtx(nv->z[k].dctx);
		free(nv->z[k].zbuf);
		free(nv->z[k].buf);
	}
	pthread_cond_destroy(&nv->cv);
	pthread_mutex_destroy(&nv->lock);
	sl__index_free(&nv->ix);
	free(nv);
}

/*
 * Version 2 indexes: the group of entries holding record i against its CRC
 * (docs/FORMAT.md), once per group; an entry copied from its neighbour or
 * otherwise damaged is refused before its record is read.  Racing
 * checkers of one group compute the same answer: no lock needed.
 */
static int sl_native_entry_check(const struct sluice_dataset *ds, uint64_t i)
{
	const struct sl_native *nv = ds->priv;
	const uint64_t g = i / SL_EGROUP, first = g * SL_EGROUP;
	const uint64_t n = nv->ix.nrecords - first < SL_EGROUP ? nv->ix.nrecords - first : SL_EGROUP;
	uint32_t want, got;

	if (!nv->group_ok || atomic_load_explicit(&nv->group_ok[g], memory_order_relaxed))
		return 0;
	want = sl__le32(nv->map + nv->ix.groups_off + 4 * g);
	got = sluice_crc32c(0, nv->map + nv->ix.entries_off + (uint64_t)SL_ENTRY * first, (size_t)(SL_ENTRY * n));
	if (got != want)
		return sl__err(SLUICE_EFORMAT, "%s: the entries of records %llu to %llu do not match their CRC (the index is "
			       "damaged)", nv->index_path, (unsigned long long)first, (unsigned long long)(first + n - 1));
	atomic_store_explicit(&nv->group_ok[g], 1, memory_order_relaxed);
	return 0;
}

static void sl_native_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_native *nv = ds->priv;
	const unsigned char *e = nv->map + nv->ix.entries_off + (uint64_t)SL_ENTRY * i;
	unsigned lo = 0, hi = nv->ix.nshards - 1;

	/* Shards hold consecutive runs of records: the last shard starting at or before i. */
	while (lo < hi) {
		unsigned mid = (lo + hi + 1) / 2;

		if (nv->ix.shard_first[mid] <= i)
			lo = mid;
		else
			hi = mid - 1;
	}
	loc->shard = lo;
	loc->offset = 8 * (uint64_t)sl__le32(e);
	loc->length = sl__le32(e + 4);
	loc->crc = sl__le32(e + 8);
}

/* Reads and checks shard s's header against the index; errors name the file. */
static int sl_shard_header(struct sluice_dataset *ds, unsigned s, struct sl__shard_hdr *sh)
{
	const struct sl_native *nv = ds->priv;
	unsigned char h[64];
	int fd = sl__ds_fd(ds, s), rc;

	if (fd < 0)
		return fd;
	rc = pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) ? sl__shard_header_parse(h, sizeof(h), sh)
							      : sl__err(SLUICE_EFORMAT, "header unreadable");
	if (!rc && (sh->shard != s || sh->nrecords != nv->ix.shard_records[s] || sh->data_len != nv->ix.shard_bytes[s]))
		rc = sl__err(SLUICE_EFORMAT, "header says shard %u, %llu records, %llu bytes; the index says shard %u, %llu, %llu",
			     sh->shard, (unsigned long long)sh->nrecords, (unsigned long long)sh->data_len, s,
			     (unsigned long long)nv->ix.shard_records[s], (unsigned long long)nv->ix.shard_bytes[s]);
	if (!rc && (sh->flags & SL_FLAG_ZSTD) != (nv->ix.flags & SL_FLAG_ZSTD))
		rc = sl__err(SLUICE_EFORMAT, "shard is %scompressed, the index says %scompressed",
			     sh->flags ? "" : "not ", nv->ix.flags ? "" : "not ");
	return rc ? sl__err(rc, "%s: %s", ds->files[s], sluice_last_error_detail()) : 0;
}

/* Shard s's block table, loaded on first use; nv->lock held. */
static int sl_blocks(struct sluice_dataset *ds, unsigned s)
{
	struct sl_native *nv = ds->priv;
	struct sl__shard_hdr sh;
	unsigned char *t = NULL;
	struct sl__block *b = NULL;
	int rc;

	if (nv->blocks[s])
		return 0;
	rc = sl_shard_header(ds, s, &sh);
	if (rc)
		return rc;
	if (sh.nblocks > (1u << 30) / SL_BLOCK_ENTRY)
		return sl__err(SLUICE_EFORMAT, "%s: %llu blocks", ds->files[s], (unsigned long long)sh.nblocks);
	t = malloc(sl__block_table_len(&sh) + 1);
	b = malloc(sizeof(*b) * sh.nblocks + 1);
	if (!t || !b)
		rc = -ENOMEM;
	else if (pread(sl__ds_fd(ds, s), t, sl__block_table_len(&sh), (off_t)sh.table_off) !=
		 (ssize_t)sl__block_table_len(&sh))
		rc = sl__err(SLUICE_EFORMAT, "%s: block table unreadable (file truncated?)", ds->files[s]);
	else if ((rc = sl__blocks_parse(t, sl__block_table_len(&sh), &sh, b)))
		rc = sl__err(rc, "%s: %s", ds->files[s], sluice_last_error_detail());
	free(t);
	if (rc) {
		free(b);
		return rc;
	}
	nv->blocks[s] = b;
	nv->nblocks[s] = sh.nblocks;
	return 0;
}

int sl__zblock_decode(struct sluice_dataset *ds, struct ZSTD_DCtx_s *dc, unsigned shard, uint64_t k,
		      const struct sl__block *b, const void *src, char **scratch, size_t *cap, void *dst)
{
	uint64_t t0;
	size_t n;
	int rc;

	if (!src) {
		if (sl__reserve(scratch, cap, b->stored))
			return sl__err(-ENOMEM, "%s: block %llu: no memory", ds->files[shard], (unsigned long long)k);
		if ((rc = sl__ds_pread(ds, shard, *scratch, b->stored, b->file, "block", k)))
			return rc;
		src = *scratch;
	}
	if (b->has_crc && SL_CRC_BAD(b->crc, sluice_crc32c(0, src, b->stored)))
		return sl__err(SLUICE_ECRC, "%s: block %llu: CRC mismatch of its stored bytes", ds->files[shard],
			       (unsigned long long)k);
	t0 = sl__now_ns();
	if (ds->ops->block_decode) { /* a reader's own blocks (format.h) */
		rc = ds->ops->block_decode(ds, shard, k, b, src, dst);
		sl__hist_add(&ds->h_decompress, sl__now_ns() - t0);
		return rc;
	}
	n = ZSTD_decompressDCtx(dc, dst, b->len, src, b->stored);
	sl__hist_add(&ds->h_decompress, sl__now_ns() - t0);
	if (ZSTD_isError(n) || n != b->len)
		return sl__err(SLUICE_EFORMAT, "%s: block %llu: %s", ds->files[shard], (unsigned long long)k,
			       ZSTD_isError(n) ? ZSTD_getErrorName(n) : "decoded size differs from the block table");
	return 0;
}

/* Reads and decompresses block lo of shard into cache entry z (the caller holds a use of it, not the lock). */
static int sl_zload(struct sluice_dataset *ds, struct sl_zcached *z, unsigned shard, uint64_t lo,
		    const struct sl__block *b, uint64_t i)
{
	int rc;

	if (sl__reserve(&z->buf, &z->cap, b->len))
		return -ENOMEM;
	rc = sl__zblock_decode(ds, z->dctx, shard, lo, b, NULL, &z->zbuf, &z->zcap, z->buf);
	return rc ? sl__err(rc, "%s (record %llu)", sluice_last_error_detail(), (unsigned long long)i) : 0;
}

/*
 * A record of a zstd dataset: its block from a cache entry (decompressed
 * there first if none has it) and copied out.
 */
static int sl_native_fetch(struct sluice_dataset *ds, uint64_t i, const struct sluice_record_loc *loc, void *buf)
{
	struct sl_native *nv = ds->priv;
	const struct sl__block *b;
	struct sl_zcached *z = NULL;
	uint64_t lo = 0, hi;
	int rc;

	pthread_mutex_lock(&nv->lock);
	rc = sl_blocks(ds, loc->shard);
	if (rc)
		goto out;
	hi = nv->nblocks[loc->shard];
	/* The last block starting at or before the record. */
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (nv->blocks[loc->shard][mid].logical <= loc->offset)
			lo = mid;
		else
			hi = mid;
	}
	b = &nv->blocks[loc->shard][lo];
	if (!nv->nblocks[loc->shard] || loc->offset < b->logical || loc->offset + loc->length > b->logical + b->len) {
		rc = sl__err(SLUICE_EFORMAT, "%s: record %llu at %llu is not inside one block", ds->files[loc->shard],
			     (unsigned long long)i, (unsigned long long)loc->offset);
		goto out;
	}
	for (;;) {
		struct sl_zcached *free_z = NULL;

		z = NULL;
		for (unsigned k = 0; k < SL_ZCACHED && !z; k++) {
			struct sl_zcached *c = &nv->z[k];

			if (c->state != SL_Z_EMPTY && c->shard == loc->shard && c->block == lo)
				z = c;
			else if (!c->users && (!free_z || c->used < free_z->used))
				free_z = c;
		}
		if (z && z->state == SL_Z_READY)
			break;
		if (!z && free_z) {
			/* Ours to fill: marked loading and used, so nobody takes or evicts it meanwhile. */
			z = free_z;
			z->state = SL_Z_LOADING;
			z->shard = loc->shard;
			z->block = lo;
			z->users = 1;
			pthread_mutex_unlock(&nv->lock);
			rc = sl_zload(ds, z, loc->shard, lo, b, i);
			pthread_mutex_lock(&nv->lock);
			z->state = rc ? SL_Z_EMPTY : SL_Z_READY;
			z->users--;
			pthread_cond_broadcast(&nv->cv);
			if (rc)
				goto out;
			continue;
		}
		/* Another caller is loading this block, or every cache entry is in use. */
		pthread_cond_wait(&nv->cv, &nv->lock);
	}
	z->users++;
	z->used = ++nv->tick;
	pthread_mutex_unlock(&nv->lock);
	memcpy(buf, z->buf + (loc->offset - b->logical), loc->length);
	pthread_mutex_lock(&nv->lock);
	z->users--;
	pthread_cond_broadcast(&nv->cv);
out:
	pthread_mutex_unlock(&nv->lock);
	return rc;
}

/* Stored and logical data bytes of every shard (zstd datasets: loads every block table). */
static int sl_native_sizes(struct sluice_dataset *ds, uint64_t *stored, uint64_t *logical)
{
	struct sl_native *nv = ds->priv;
	int rc = 0;

	*stored = *logical = 0;
	pthread_mutex_lock(&nv->lock);
	for (unsigned s = 0; !rc && s < nv->ix.nshards; s++) {
		*logical += nv->ix.shard_bytes[s];
		if (!ds->compressed) {
			*stored += nv->ix.shard_bytes[s];
			continue;
		}
		rc = sl_blocks(ds, s);
		for (uint64_t k = 0; !rc && k < nv->nblocks[s]; k++)
			*stored += nv->blocks[s][k].stored;
	}
	pthread_mutex_unlock(&nv->lock);
	return rc;
}

static int sl_native_blocks(struct sluice_dataset *ds, unsigned s, const struct sl__block **b, uint64_t *n)
{
	struct sl_native *nv = ds->priv;
	int rc;

	pthread_mutex_lock(&nv->lock);
	rc = sl_blocks(ds, s);
	*b = rc ? NULL : nv->blocks[s];
	*n = rc ? 0 : nv->nblocks[s];
	pthread_mutex_unlock(&nv->lock);
	return rc;
}

static int sl_native_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			    struct sluice_record *rec)
{
	(void)i;
	return sl__record_decode(ds->fields, ds->nfields, p, len, rec);
}

static void sl_report(void (*bad)(const struct sluice_bad *, void *), void *user, uint64_t rec, unsigned shard,
		      uint64_t off, int code)
{
	struct sluice_bad b = { rec, shard, off, code, sluice_last_error_detail() };

	if (bad)
		bad(&b, user);
}

/* Shard headers against the index, and records in order inside their shards. */
static int64_t sl_native_check(struct sluice_dataset *ds, void (*bad)(const struct sluice_bad *, void *),
			       void *user)
{
	struct sl_native *nv = ds->priv;
	const unsigned S = nv->ix.nshards;
	uint64_t *next = calloc(S, sizeof(uint64_t)), *count = calloc(S, sizeof(uint64_t));
	int64_t problems = 0;

	if (!next || !count) {
		free(next);
		free(count);
		return -ENOMEM;
	}
	for (unsigned s = 0; s < S; s++) {
		struct sl__shard_hdr sh = { 0 };
		struct stat st;
		int rc = sl_shard_header(ds, s, &sh);
		uint64_t want = sh.flags ? sh.table_off + sl__block_table_len(&sh) : SL_HDR_SIZE + sh.data_len;

		next[s] = SL_HDR_SIZE;
		if (!rc && (fstat(sl__ds_fd(ds, s), &st) < 0 || (uint64_t)st.st_size != want))
			rc = sl__err(SLUICE_EFORMAT, "%s: file is %lld bytes, header says %llu", ds->files[s],
				     (long long)st.st_size, (unsigned long long)want);
		if (!rc && sh.flags) {
			pthread_mutex_lock(&nv->lock);
			rc = sl_blocks(ds, s);
			pthread_mutex_unlock(&nv->lock);
		}
		if (rc) {
			sl_report(bad, user, UINT64_MAX, s, 0, rc);
			problems++;
		}
	}
	for (uint64_t i = 0; i < ds->nrecords; i++) {
		struct sluice_record_loc loc;

		sl_native_locate(ds, i, &loc);
		if (loc.shard >= S)
			continue; /* the read pass reports it */
		if (loc.offset < next[loc.shard] || loc.offset % 8) {
			sl__err(SLUICE_EFORMAT, "record %llu overlaps the previous record of shard %u or is misaligned",
				(unsigned long long)i, loc.shard);
			sl_report(bad, user, i, loc.shard, loc.offset, SLUICE_EFORMAT);
			problems++;
		}
		if (loc.offset + loc.length > next[loc.shard])
			next[loc.shard] = loc.offset + loc.length;
		count[loc.shard]++;
	}
	for (unsigned s = 0; s < S; s++)
		if (count[s] != nv->ix.shard_records[s]) {
			sl__err(SLUICE_EFORMAT, "%s: the index places %llu records in it, its table says %llu", ds->files[s],
				(unsigned long long)count[s], (unsigned long long)nv->ix.shard_records[s]);
			sl_report(bad, user, UINT64_MAX, s, 0, SLUICE_EFORMAT);
			problems++;
		}
	free(next);
	free(count);
	return problems;
}

const struct sl__ds_ops sl__ds_native_ops = {
	.name = "sluice",
	.probe = sl_native_probe,
	.open = sl_native_open,
	.close = sl_native_close,
	.locate = sl_native_locate,
	.entry_check = sl_native_entry_check,
	.decode = sl_native_decode,
	.check = sl_native_check,
	.fetch = sl_native_fetch,
	.sizes = sl_native_sizes,
	.blocks = sl_native_blocks,
};
