/*
 * Many dataset records in one call through the engine: extents of the
 * records become one batched job (neighbours coalesced into large I/Os),
 * workers compute each piece's CRC32C from the host bytes before any DMA,
 * and the pieces' CRCs are combined per record and compared here.
 */
#include <errno.h>
#include <stdlib.h>

#include "format/format.h"
#include "xfer/xfer.h"

/*
 * zstd datasets: records are decompressed on the CPU (each block once while
 * a batch walks through it) into host memory, then copied to dst in one go.
 */
static ssize_t sl_read_compressed(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx,
				  size_t n, const struct sluice_record_loc *loc, const struct sluice_range *r,
				  void *dst, uint64_t pos)
{
	int gpu = sluice_is_gpu_ptr(eng, dst);
	char *host = gpu ? malloc(pos ? pos : 1) : dst;
	ssize_t rc = 0;

	if (!host)
		return -ENOMEM;
	for (size_t k = 0; rc >= 0 && k < n; k++)
		rc = sluice_dataset_read(ds, idx[k], host + ((char *)r[k].buf - (char *)dst), loc[k].length, NULL);
	if (rc >= 0 && gpu && pos)
		rc = sluice_gpu_copy(eng, dst, host, pos);
	if (gpu)
		free(host);
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
	if (rep)
		memset(rep, 0, sizeof(*rep));
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
