/*
 * Many dataset records in one call through the engine: extents of the
 * records become one batched job (neighbours coalesced into large I/Os),
 * workers compute each piece's CRC32C from the host bytes before any DMA,
 * and the pieces' CRCs are combined per record and compared here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "dsread/dsread.h"

/*
 * zstd datasets: the blocks the records lie in, each decoded once on the
 * CPU (the engine's thread count in parallel, each block read with one
 * pread), then every record copied out and its CRC checked, into host
 * memory, then copied to dst in one go.
 */
struct sl_zrec {
	unsigned shard;
	uint64_t block; /* index in the shard's block table */
	const struct sl__block *b; /* that entry */
	size_t k;       /* the record's place in the batch */
};

static int sl_zrec_cmp(const void *a, const void *b)
{
	const struct sl_zrec *x = a, *y = b;

	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return x->block < y->block ? -1 : x->block > y->block;
}

static ssize_t sl_read_compressed(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx,
				  size_t n, const struct sluice_record_loc *loc, const struct sluice_range *r,
				  void *dst, uint64_t pos)
{
	int gpu = sluice_is_gpu_ptr(eng, dst);
	char *host = gpu ? malloc(pos ? pos : 1) : dst, *dec = NULL;
	struct sl_zrec *zr = malloc((n ? n : 1) * sizeof(*zr));
	struct sl__zblock *zb = malloc((n ? n : 1) * sizeof(*zb));
	uint64_t nb = 0, declen = 0;
	ssize_t rc = 0;

	if (!host || !zr || !zb) {
		rc = -ENOMEM;
		goto out;
	}
	/* Each record's block: the last one starting at or before it. */
	for (size_t k = 0; k < n; k++) {
		const struct sl__block *b;
		uint64_t nblk, lo = 0, hi;

		if ((rc = ds->ops->blocks(ds, loc[k].shard, &b, &nblk)))
			goto out;
		for (hi = nblk; hi - lo > 1;) {
			uint64_t mid = lo + (hi - lo) / 2;

			if (b[mid].logical <= loc[k].offset)
				lo = mid;
			else
				hi = mid;
		}
		if (!nblk || loc[k].offset < b[lo].logical || loc[k].offset + loc[k].length > b[lo].logical + b[lo].len) {
			rc = sl__err(SLUICE_EFORMAT, "%s: record %llu at logical offset %llu lies in no block",
				     ds->files[loc[k].shard], (unsigned long long)idx[k], (unsigned long long)loc[k].offset);
			goto out;
		}
		zr[k] = (struct sl_zrec){ loc[k].shard, lo, &b[lo], k };
	}
	/* The distinct blocks, each with its place in dec. */
	qsort(zr, n, sizeof(*zr), sl_zrec_cmp);
	for (size_t k = 0; k < n; k++) {
		if (!nb || zr[k].shard != zb[nb - 1].shard || zr[k].block != zb[nb - 1].index) {
			zb[nb++] = (struct sl__zblock){ zr[k].b, zr[k].shard, zr[k].block, declen };
			declen += zr[k].b->len;
		}
		zr[k].block = nb - 1; /* from here on: the index into zb */
	}
	if (!(dec = malloc(declen ? declen : 1))) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = sl__zdecode(eng, ds, zb, nb, NULL, 0, dec)))
		goto out;
	for (size_t q = 0; q < n; q++) {
		size_t k = zr[q].k;
		const struct sl__zblock *z = &zb[zr[q].block];
		const char *src = dec + z->out_off + (loc[k].offset - z->b->logical);

		if (ds->has_crc && sluice_crc32c(0, src, loc[k].length) != loc[k].crc) {
			rc = sl__err(SLUICE_ECRC, "%s: record %llu at logical offset %llu: CRC mismatch",
				     ds->files[loc[k].shard], (unsigned long long)idx[k], (unsigned long long)loc[k].offset);
			goto out;
		}
		memcpy(host + ((char *)r[k].buf - (char *)dst), src, loc[k].length);
	}
	if (gpu && pos)
		rc = sluice_gpu_copy(eng, dst, host, pos);
out:
	if (gpu)
		free(host);
	free(dec);
	free(zr);
	free(zb);
	return rc;
}

ssize_t sluice_dataset_read_batch(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx,
				  size_t n, void *dst, size_t cap, uint64_t *offsets,
				  struct sluice_xfer_report *rep)
{
	struct sluice_file **files = calloc(ds->nfiles ? ds->nfiles : 1, sizeof(*files));
	struct sluice_record_loc *loc = malloc((n ? n : 1) * sizeof(*loc));
	struct sluice_range *r = malloc((n ? n : 1) * sizeof(*r));
	uint64_t pos = 0;
	struct sl__job job;
	ssize_t rc = 0;

	sl__err_clear();
	if ((rc = SL_REPORT_IN(rep, xfer_report)))
		goto out;
	if (!files || !loc || !r) {
		rc = -ENOMEM;
		goto out;
	}
	/* Where each record lies, and where it lands: back to back, 8-byte aligned. */
	for (size_t k = 0; k < n; k++) {
		rc = sluice_dataset_locate(ds, idx[k], &loc[k]);
		if (!rc)
			rc = sl__ds_loc_check(ds, idx[k], &loc[k]);
		if (rc)
			goto out;
		if (offsets)
			offsets[k] = pos;
		r[k] = (struct sluice_range){ NULL, loc[k].offset, loc[k].length, (char *)dst + pos };
		pos = sl__align_up(pos + loc[k].length, 8);
	}
	if (offsets)
		offsets[n] = pos;
	if (pos > cap) {
		rc = sl__err(-ENOSPC, "%zu records need %llu bytes, the buffer has %zu", n, (unsigned long long)pos, cap);
		goto out;
	}
	if (ds->compressed) {
		rc = sl_read_compressed(eng, ds, idx, n, loc, r, dst, pos);
		if (rc >= 0)
			rc = (ssize_t)pos;
		goto out;
	}
	/* The engine's handles of the data files this batch touches. */
	for (size_t k = 0; k < n; k++) {
		unsigned f = loc[k].shard;
		char path[4096];

		if (!files[f] && ((rc = sl__ds_path(ds, f, path, sizeof(path))) ||
				  (rc = sluice_file_open(&files[f], eng, path, SLUICE_RDONLY))))
			goto out;
		r[k].file = files[f];
	}
	rc = sl__plan(eng, &job, SL_IO_READ, r, n, ds->has_crc);
	if (rc)
		goto out;
	/* The padding between records in dst is ours: neighbours move in one copy. */
	job.copy_gaps = 1;
	sl__job_submit(eng, &job);
	rc = sl__job_wait(eng, &job, rep);
	/* A record's pieces are consecutive and in file order: fold their CRCs. */
	for (size_t p = 0; rc >= 0 && ds->has_crc && p < job.npieces;) {
		uint32_t k = job.pieces[p].range, crc = job.pieces[p].crc;

		for (p++; p < job.npieces && job.pieces[p].range == k; p++)
			crc = sl__crc32c_combine(crc, job.pieces[p].crc, job.pieces[p].len);
		if (crc != loc[k].crc)
			rc = sl__err(SLUICE_ECRC, "%s: record %llu at offset %llu: CRC mismatch", ds->files[loc[k].shard],
				     (unsigned long long)idx[k], (unsigned long long)loc[k].offset);
	}
	sl__plan_free(&job);
	if (rc >= 0)
		rc = (ssize_t)pos;
out:
	for (unsigned f = 0; files && f < ds->nfiles; f++)
		sluice_file_close(files[f]);
	free(files);
	free(loc);
	free(r);
	return rc;
}
