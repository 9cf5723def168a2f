/*
 * Many dataset records in one call through the engine: extents of the
 * records become one batched job (neighbours coalesced into large I/Os),
 * workers compute each piece's CRC32C from the host bytes before any DMA,
 * and the pieces' CRCs are combined per record and compared here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "format/format.h"
#include "dsread/dsread.h"

/* The engine's handle of shard f's file, bound on its first use (files: one slot a shard, released by sl_files_release). */
static int sl_file_of(struct sluice_engine *eng, struct sluice_dataset *ds, struct sluice_file **files, unsigned f)
{
	return files[f] ? 0 : sl__bind_file(eng, ds, f, &files[f]);
}

static void sl_files_release(struct sluice_engine *eng, const struct sluice_dataset *ds, struct sluice_file **files)
{
	for (unsigned f = 0; files && f < ds->nfiles; f++)
		sl__bind_release(eng, files[f]);
	free(files);
}

/* The n ranges read as one engine job (pieces' CRCs computed where crc): the job is the caller's to free. */
static ssize_t sl_read_job(struct sluice_engine *eng, struct sl__job *job, struct sluice_range *r, size_t n, int crc,
			   struct sluice_xfer_report *rep)
{
	ssize_t rc = sl__plan(eng, job, SL_IO_READ, r, n, crc);

	if (rc)
		return rc;
	/* The padding between ranges in the destination is ours: neighbours move in one copy. */
	job->copy_gaps = 1;
	sl__job_submit(eng, job);
	return sl__job_wait(eng, job, rep);
}

/*
 * Each of the n ranges' CRC32C from a job read with crc on: a range's
 * pieces are consecutive and in file order, its first piece's CRC taken
 * as it is (a combine costs a few microseconds, once a record adds up).
 */
static void sl_range_crcs(const struct sl__job *job, uint32_t *crc, size_t n)
{
	memset(crc, 0, n * sizeof(*crc));
	for (size_t p = 0; p < job->npieces; p++) {
		const struct sl__piece *q = &job->pieces[p];

		crc[q->range] = p && q[-1].range == q->range ? sl__crc32c_combine(crc[q->range], q->crc, q->len) : q->crc;
	}
}

int sl__read_blocks(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb, uint64_t n,
		    void *const *to, struct sluice_xfer_report *rep)
{
	struct sluice_file **files = calloc(ds->nfiles ? ds->nfiles : 1, sizeof(*files));
	struct sluice_range *r = malloc((n ? n : 1) * sizeof(*r));
	uint32_t *crc = malloc((n ? n : 1) * sizeof(*crc));
	struct sl__job job = { 0 };
	ssize_t rc = files && r && crc ? 0 : -ENOMEM;

	for (uint64_t k = 0; k < n && !rc; k++) {
		if (!zb[k].b->has_crc)
			rc = sl__err(-EINVAL, "%s: zstd block %llu has no CRC", ds->files[zb[k].shard],
				     (unsigned long long)zb[k].index);
		else if (!(rc = sl_file_of(eng, ds, files, zb[k].shard)))
			r[k] = (struct sluice_range){ files[zb[k].shard], zb[k].b->file, zb[k].b->stored, to[k] };
	}
	if (!rc)
		rc = sl_read_job(eng, &job, r, n, 1, rep);
	if (rc >= 0) {
		rc = 0;
		sl_range_crcs(&job, crc, n);
	}
	for (uint64_t k = 0; k < n && !rc; k++)
		if (SL_CRC_BAD(zb[k].b->crc, crc[k]))
			rc = sl__err(SLUICE_ECRC, "%s: zstd block %llu: CRC mismatch of its stored bytes",
				     ds->files[zb[k].shard], (unsigned long long)zb[k].index);
	sl__plan_free(&job);
	sl_files_release(eng, ds, files);
	free(r);
	free(crc);
	return (int)rc;
}

int sl__read_shard_records(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, char *dst,
			   uint64_t logical, struct sluice_xfer_report *rep)
{
	struct sluice_file **files = calloc(ds->nfiles ? ds->nfiles : 1, sizeof(*files));
	uint64_t first = 0, n = 0, at = SL_ALIGN, nr = 0, recs, bytes;
	struct sluice_range *r = NULL;
	struct sluice_record_loc *loc = NULL;
	uint32_t *crc = NULL;
	struct sl__job job = { 0 };
	ssize_t rc = files ? 0 : -ENOMEM;

	for (unsigned s = 0; s < shard && !rc; s++)
		if (!(rc = sluice_dataset_shard_info(ds, s, &recs, &bytes)))
			first += recs;
	if (!rc && !(rc = sluice_dataset_shard_info(ds, shard, &n, &bytes)) &&
	    (!(r = malloc((2 * n + 1) * sizeof(*r))) || !(loc = malloc((n + 1) * sizeof(*loc))) ||
	     !(crc = malloc((2 * n + 1) * sizeof(*crc)))))
		rc = -ENOMEM;
	if (!rc)
		rc = sl_file_of(eng, ds, files, shard);
	/* Each record a range of its own (its CRC checked), and the padding between them one too. */
	for (uint64_t k = 0; k < n && !rc; k++) {
		if ((rc = sluice_dataset_locate(ds, first + k, &loc[k])) || (rc = sl__ds_loc_check(ds, first + k, &loc[k])))
			break;
		if (loc[k].shard != shard || loc[k].offset < at || loc[k].offset + loc[k].length > SL_ALIGN + logical) {
			rc = sl__err(SLUICE_EFORMAT, "%s: record %llu at %llu out of place in its shard", ds->files[shard],
				     (unsigned long long)(first + k), (unsigned long long)loc[k].offset);
			break;
		}
		if (loc[k].offset > at)
			r[nr++] = (struct sluice_range){ files[shard], at, loc[k].offset - at, dst + (at - SL_ALIGN) };
		r[nr++] = (struct sluice_range){ files[shard], loc[k].offset, loc[k].length, dst + (loc[k].offset - SL_ALIGN) };
		at = loc[k].offset + loc[k].length;
	}
	if (!rc && at < SL_ALIGN + logical)
		r[nr++] = (struct sluice_range){ files[shard], at, SL_ALIGN + logical - at, dst + (at - SL_ALIGN) };
	if (!rc)
		rc = sl_read_job(eng, &job, r, nr, ds->has_crc, rep);
	if (rc >= 0) {
		rc = 0;
		if (ds->has_crc)
			sl_range_crcs(&job, crc, nr);
	}
	for (uint64_t k = 0, q = 0; ds->has_crc && k < n && !rc; k++, q++) {
		q += r[q].offset != loc[k].offset; /* past the padding before it */
		if (crc[q] != loc[k].crc)
			rc = sl__err(SLUICE_ECRC, "%s: record %llu at offset %llu: CRC mismatch", ds->files[shard],
				     (unsigned long long)(first + k), (unsigned long long)loc[k].offset);
	}
	sl__plan_free(&job);
	sl_files_release(eng, ds, files);
	free(r);
	free(loc);
	free(crc);
	return (int)rc;
}

/*
 * On the GPU (z): the blocks' stored bytes read through the engine into
 * pinned memory, each checked by its CRC and to be one zstd frame of its
 * table entry's sizes (nvCOMP trusts its input: corrupt input may never
 * finish decoding), up to the GPU, decoded there in one call, and the
 * decoded blocks back in pinned memory (*dec): the records' CRCs are
 * checked on the host after, as for the CPU's.
 */
static int sl_zdecode_gpu(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb,
			  uint64_t nb, uint64_t declen, struct sl__zgpu *z, struct sluice_xfer_report *rep, char **dec,
			  struct sl__zreport *zr)
{
	uint64_t t0 = sl__now_ns(), t1;
	void **to = malloc((nb ? nb : 1) * sizeof(*to));
	struct sl__zgpu_item *it = malloc((nb ? nb : 1) * sizeof(*it));
	const struct sl__cuda_api *cu = z->g->cu;
	uint64_t inlen = 0, bad;
	int rc = to && it ? 0 : -ENOMEM;

	for (uint64_t k = 0; k < nb && !rc; k++) {
		it[k] = (struct sl__zgpu_item){ inlen, zb[k].out_off, zb[k].b->stored, zb[k].b->len };
		inlen += sl__align_up(zb[k].b->stored, SL_ZGPU_ALIGN);
	}
	if (!rc && !(rc = sl__gbuf_room(z->g, &z->in, inlen + 1, 0, "zstd blocks")) &&
	    !(rc = sl__gbuf_room(z->g, &z->in_dev, inlen + 1, 1, "zstd blocks")) &&
	    !(rc = sl__gbuf_room(z->g, &z->out_dev, declen + 1, 1, "zstd blocks")))
		rc = sl__gbuf_room(z->g, &z->out, declen + 1, 0, "zstd blocks");
	for (uint64_t k = 0; k < nb && !rc; k++)
		to[k] = (char *)z->in.p + it[k].in;
	if (!rc)
		rc = sl__read_blocks(eng, ds, zb, nb, to, rep);
	t1 = sl__now_ns();
	/* Checked by their CRCs, and each one zstd frame of its table entry's sizes. */
	for (uint64_t k = 0; k < nb && !rc; k++) {
		const struct sl__block *b = zb[k].b;

		if (ZSTD_getFrameContentSize(to[k], b->stored) != b->len ||
		    ZSTD_findFrameCompressedSize(to[k], b->stored) != b->stored)
			rc = sl__err(SLUICE_EFORMAT, "%s: zstd block %llu: not one zstd frame of %u bytes decoding to %u",
				     ds->files[zb[k].shard], (unsigned long long)zb[k].index, b->stored, b->len);
		it[k].in += (uint64_t)(uintptr_t)z->in_dev.p;
		it[k].out += (uint64_t)(uintptr_t)z->out_dev.p;
	}
	if (!rc && !(rc = sl__gpu_bind(z->g)))
		rc = SL_CU(cu->MemcpyHtoDAsync((sl_CUdeviceptr)(uintptr_t)z->in_dev.p, z->in.p, inlen, z->st),
			   "cuMemcpyHtoDAsync (zstd blocks)");
	if (!rc && (rc = sl__zgpu_run(z, it, nb, &bad)) == SLUICE_EFORMAT)
		rc = sl__err(rc, "%s: zstd block %llu: %s", ds->files[zb[bad].shard], (unsigned long long)zb[bad].index,
			     sluice_last_error_detail());
	if (!rc && !(rc = SL_CU(cu->MemcpyDtoHAsync(z->out.p, (sl_CUdeviceptr)(uintptr_t)z->out_dev.p, declen, z->st),
				"cuMemcpyDtoHAsync (decoded blocks)")))
		rc = SL_CU(cu->StreamSynchronize(z->st), "cuStreamSynchronize (decoded blocks)");
	*dec = z->out.p;
	if (zr) {
		zr->read_ns += t1 - t0;
		zr->decode_ns += sl__now_ns() - t1;
	}
	free(to);
	free(it);
	return rc;
}

/*
 * zstd datasets: the blocks the records lie in, each decoded once, on the
 * GPU (z) or the CPU (the engine's thread count in parallel, each block
 * read with one pread), then every record copied out and its CRC checked,
 * into host memory, then copied to dst in one go.
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

/*
 * Each record's block (the last one starting at or before it) into zr, and
 * the distinct blocks into zb (*nb), each with its place in the decoded
 * bytes (*declen in all, each block's place aligned to align); zr[].block
 * becomes the index into zb.
 */
static int sl_zblocks_of(struct sluice_dataset *ds, const uint64_t *idx, size_t n, const struct sluice_record_loc *loc,
			 uint64_t align, struct sl_zrec *zr, struct sl__zblock *zb, uint64_t *nb, uint64_t *declen)
{
	int rc;

	for (size_t k = 0; k < n; k++) {
		const struct sl__block *b;
		uint64_t nblk, lo = 0, hi;

		if ((rc = ds->ops->blocks(ds, loc[k].shard, &b, &nblk)))
			return rc;
		for (hi = nblk; hi - lo > 1;) {
			uint64_t mid = lo + (hi - lo) / 2;

			if (b[mid].logical <= loc[k].offset)
				lo = mid;
			else
				hi = mid;
		}
		if (!nblk || loc[k].offset < b[lo].logical || loc[k].offset + loc[k].length > b[lo].logical + b[lo].len)
			return sl__err(SLUICE_EFORMAT, "%s: record %llu at logical offset %llu lies in no block",
				       ds->files[loc[k].shard], (unsigned long long)idx[k], (unsigned long long)loc[k].offset);
		zr[k] = (struct sl_zrec){ loc[k].shard, lo, &b[lo], k };
	}
	qsort(zr, n, sizeof(*zr), sl_zrec_cmp);
	*nb = *declen = 0;
	for (size_t k = 0; k < n; k++) {
		if (!*nb || zr[k].shard != zb[*nb - 1].shard || zr[k].block != zb[*nb - 1].index) {
			zb[(*nb)++] = (struct sl__zblock){ zr[k].b, zr[k].shard, zr[k].block, *declen };
			*declen += sl__align_up(zr[k].b->len, align);
		}
		zr[k].block = *nb - 1;
	}
	return 0;
}

/* On the CPU: the nb blocks read (a pread each, counted in rep) and decoded by the engine's threads into *dec. */
static int sl_zdecode_cpu(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb,
			  uint64_t nb, uint64_t declen, struct sluice_xfer_report *rep, char **dec,
			  struct sl__zreport *zr)
{
	uint64_t t0 = sl__now_ns();
	int rc;

	if (!(*dec = malloc(declen ? declen : 1)))
		return -ENOMEM;
	if ((rc = sl__zdecode(eng, ds, zb, nb, NULL, 0, *dec)))
		return rc;
	if (zr)
		zr->decode_ns += sl__now_ns() - t0;
	for (uint64_t k = 0; rep && k < nb; k++) {
		rep->bytes += zb[k].b->stored;
		rep->bytes_buffered += zb[k].b->stored;
		rep->ios++;
	}
	if (rep)
		snprintf(rep->path, sizeof(rep->path), "psync:buffered>host");
	return 0;
}

static ssize_t sl_read_compressed(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx,
				  size_t n, const struct sluice_record_loc *loc, const struct sluice_range *r,
				  void *dst, uint64_t pos, struct sl__zgpu *z, struct sluice_xfer_report *rep,
				  struct sl__zreport *zrep)
{
	int gpu = sluice_is_gpu_ptr(eng, dst);
	char *host = gpu ? malloc(pos ? pos : 1) : dst, *dec = NULL, *gdec = NULL;
	struct sl_zrec *zr = malloc((n ? n : 1) * sizeof(*zr));
	struct sl__zblock *zb = malloc((n ? n : 1) * sizeof(*zb));
	uint64_t nb = 0, declen = 0;
	ssize_t rc = host && zr && zb ? 0 : -ENOMEM;

	if (!rc)
		rc = sl_zblocks_of(ds, idx, n, loc, z ? SL_ZGPU_ALIGN : 1, zr, zb, &nb, &declen);
	/* nvCOMP only where every block's stored bytes can be checked first (packs since block CRCs). */
	for (uint64_t k = 0; !rc && z && k < nb; k++)
		if (!zb[k].b->has_crc)
			z = NULL;
	if (!rc && zrep)
		*(z ? &zrep->blocks_gpu : &zrep->blocks_cpu) += nb;
	if (!rc)
		rc = z ? sl_zdecode_gpu(eng, ds, zb, nb, declen, z, rep, &gdec, zrep)
		       : sl_zdecode_cpu(eng, ds, zb, nb, declen, rep, &dec, zrep);
	/* Every record copied out of its decoded block, its CRC checked. */
	for (size_t q = 0; !rc && q < n; q++) {
		size_t k = zr[q].k;
		const struct sl__zblock *b = &zb[zr[q].block];
		const char *src = (z ? gdec : dec) + b->out_off + (loc[k].offset - b->b->logical);

		if (ds->has_crc && sluice_crc32c(0, src, loc[k].length) != loc[k].crc)
			rc = sl__err(SLUICE_ECRC, "%s: record %llu at logical offset %llu: CRC mismatch",
				     ds->files[loc[k].shard], (unsigned long long)idx[k], (unsigned long long)loc[k].offset);
		else
			memcpy(host + ((char *)r[k].buf - (char *)dst), src, loc[k].length);
	}
	if (!rc && gpu && pos)
		rc = sluice_gpu_copy(eng, dst, host, pos);
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
	return sl__dataset_read_batch(eng, ds, idx, n, dst, cap, offsets, rep, NULL, NULL);
}

ssize_t sl__dataset_read_batch(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx, size_t n,
			       void *dst, size_t cap, uint64_t *offsets, struct sluice_xfer_report *rep,
			       struct sl__zgpu *z, struct sl__zreport *zr)
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
		rc = sl_read_compressed(eng, ds, idx, n, loc, r, dst, pos, z, rep, zr);
		if (rc >= 0)
			rc = (ssize_t)pos;
		goto out;
	}
	/* The engine's handles of the data files this batch touches. */
	for (size_t k = 0; k < n; k++) {
		if ((rc = sl_file_of(eng, ds, files, loc[k].shard)))
			goto out;
		r[k].file = files[loc[k].shard];
	}
	memset(&job, 0, sizeof(job));
	rc = sl_read_job(eng, &job, r, n, ds->has_crc, rep);
	if (rc >= 0 && ds->has_crc) {
		uint32_t *crc = malloc((n ? n : 1) * sizeof(*crc));

		if (crc)
			sl_range_crcs(&job, crc, n);
		for (size_t k = 0; rc >= 0 && k < n; k++)
			if (!crc || crc[k] != loc[k].crc)
				rc = crc ? sl__err(SLUICE_ECRC, "%s: record %llu at offset %llu: CRC mismatch",
						   ds->files[loc[k].shard], (unsigned long long)idx[k],
						   (unsigned long long)loc[k].offset)
					 : -ENOMEM;
		free(crc);
	}
	sl__plan_free(&job);
	if (rc >= 0)
		rc = (ssize_t)pos;
out:
	sl_files_release(eng, ds, files);
	free(loc);
	free(r);
	return rc;
}
