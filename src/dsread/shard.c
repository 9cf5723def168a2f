/*
 * A whole shard's records into GPU (or host) memory (sluice.h): the stored
 * bytes through the engine (storage -> pinned slots -> their destination),
 * then for zstd shards every block decoded at once.  On the GPU, nvCOMP's
 * batched zstd decoder writes each block straight to its place in dst; on
 * the CPU, the engine's thread count of zstd contexts decode into pinned
 * host memory, copied to dst in one go.  SLUICE_DECODE (auto, gpu, cpu)
 * chooses; auto takes the GPU when dst is GPU memory and nvCOMP loads.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "format/format.h"
#include "dsread/dsread.h"

/*
 * zstd blocks decoded on the CPU (dsread.h): the blocks' stored bytes from
 * in (the stored bytes of a shard from file offset base) or, with in NULL,
 * read with pread from their shard files; each decoded to out + out_off[k].
 * The engine's thread count decodes in parallel (this thread too).
 */
struct sl_zjob {
	struct sluice_dataset *ds;
	const struct sl__zblock *zb;
	uint64_t n, base;
	const char *in;
	char *out;
	_Atomic uint64_t next;
	struct sl__first_err fail;
};

static void *sl_zworker(void *arg)
{
	struct sl_zjob *j = arg;
	ZSTD_DCtx *dc = ZSTD_createDCtx();
	char *zbuf = NULL;
	size_t zcap = 0;
	uint64_t k;

	if (!dc) {
		sl__first_err_keep(&j->fail, sl__err(-ENOMEM, "no memory for a zstd context"));
		return NULL;
	}
	while (!atomic_load(&j->fail.err) && (k = atomic_fetch_add(&j->next, 1)) < j->n) {
		const struct sl__zblock *z = &j->zb[k];
		const char *src = j->in ? j->in + (z->b->file - j->base) : NULL;
		sl__first_err_keep(&j->fail, sl__zblock_decode(j->ds, dc, z->shard, z->index, z->b, src, &zbuf, &zcap,
							       j->out + z->out_off));
	}
	free(zbuf);
	ZSTD_freeDCtx(dc);
	return NULL;
}

int sl__zdecode(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb, uint64_t n,
		const void *in, uint64_t base, void *out)
{
	struct sl_zjob j;
	unsigned nt = sl__eng_cfg(eng)->threads < n ? sl__eng_cfg(eng)->threads : (unsigned)n;
	int rc;

	memset(&j, 0, sizeof(j));
	j.ds = ds, j.zb = zb, j.n = n, j.in = in, j.base = base, j.out = out;
	sl__first_err_init(&j.fail);
	sl__fanout(nt ? nt : 1, sl_zworker, &j);
	rc = sl__first_err_raise(&j.fail);
	sl__first_err_fini(&j.fail);
	return rc;
}

/*
 * The batch's shape for nvCOMP: the largest and the total decoded bytes,
 * the scratch that outputs need where any lands misaligned for nvCOMP
 * (*misaligned), each block's output padded to 256 bytes there.
 */
static int sl_nv_shape(const struct sl__nvcomp_api *nc, struct sl__nvcomp_opts opts, const struct sl__block *blk,
		       uint64_t n, uint64_t base, const char *dst, uint64_t *max, uint64_t *total, uint64_t *scratch_len,
		       int *misaligned)
{
	struct sl__nvcomp_align al;
	int rc = nc->ZstdGetRequiredAlignments(opts, &al);

	if (rc)
		return sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressGetRequiredAlignments: status %d", rc);
	*max = *total = *scratch_len = 0;
	*misaligned = 0;
	for (uint64_t k = 0; k < n; k++) {
		*max = blk[k].len > *max ? blk[k].len : *max;
		*total += blk[k].len;
		*misaligned |= al.output > 1 && (uintptr_t)(dst + (blk[k].logical - SL_ALIGN)) % al.output;
		*misaligned |= al.input > 1 && (blk[k].file - base) % al.input;
		*scratch_len += sl__align_up(blk[k].len, 256);
	}
	return 0;
}

/*
 * What nvCOMP said of each block (h as sl_decode_gpu lays it out): its
 * status and decoded size checked; outputs decoded into the scratch copied
 * to their places in dst.
 */
static int sl_nv_results(const struct sl__cuda_api *cu, const uint64_t *h, const struct sl__block *blk, uint64_t n,
			 const char *file, char *dst, sl_CUdeviceptr d_scratch)
{
	int rc = 0;

	for (uint64_t k = 0; k < n; k++) {
		int status = ((const int *)(h + 5 * n))[k];

		if (status || h[3 * n + k] != blk[k].len)
			return sl__err(SLUICE_EFORMAT, "%s: block %llu: nvCOMP status %d, %llu bytes decoded of %u", file,
				       (unsigned long long)k, status, (unsigned long long)h[3 * n + k], blk[k].len);
	}
	for (uint64_t k = 0, sc = 0; d_scratch && k < n && !rc; k++) {
		rc = SL_CU(cu->Memcpy((sl_CUdeviceptr)(uintptr_t)(dst + (blk[k].logical - SL_ALIGN)), d_scratch + sc,
				      blk[k].len), "cuMemcpy (nvCOMP output)");
		sc += sl__align_up(blk[k].len, 256);
	}
	return rc;
}

/* nvCOMP: every block decoded by one batched call into its place in dst (or a scratch, when misaligned). */
static int sl_decode_gpu(struct sluice_engine *eng, const struct sl__nvcomp_api *nc, const struct sl__block *blk,
			 uint64_t n, uint64_t base, const char *file, char *dst, sl_CUdeviceptr in)
{
	const struct sl__cuda_api *cu = sl__eng_gpu(eng)->cu;
	struct sl__nvcomp_opts opts;
	uint64_t max = 0, total = 0, scratch_len = 0;
	size_t temp = 0, arr = n * (5 * sizeof(uint64_t) + sizeof(int));
	uint64_t *h = calloc(1, arr + 1);
	sl_CUdeviceptr d_arr = 0, d_temp = 0, d_scratch = 0;
	sl_CUstream st = NULL;
	int rc, misaligned = 0;

	memset(&opts, 0, sizeof(opts));
	if (!h)
		return -ENOMEM;
	if ((rc = sl_nv_shape(nc, opts, blk, n, base, dst, &max, &total, &scratch_len, &misaligned)))
		goto out;
	if ((rc = sl__gpu_bind(sl__eng_gpu(eng))) || (rc = SL_CU(cu->StreamCreate(&st, 1), "cuStreamCreate")) ||
	    (rc = SL_CU(cu->MemAlloc(&d_arr, arr), "cuMemAlloc (nvCOMP arguments)")))
		goto out;
	if (misaligned && (rc = SL_CU(cu->MemAlloc(&d_scratch, scratch_len), "cuMemAlloc (nvCOMP output)")))
		goto out;
	/* h: in pointers, in sizes, out capacities, out sizes (filled by nvCOMP), out pointers, statuses. */
	for (uint64_t k = 0, sc = 0; k < n; k++) {
		h[k] = in + (blk[k].file - base);
		h[n + k] = blk[k].stored;
		h[2 * n + k] = blk[k].len;
		h[4 * n + k] = misaligned ? d_scratch + sc : (uint64_t)(uintptr_t)(dst + (blk[k].logical - SL_ALIGN));
		sc += sl__align_up(blk[k].len, 256);
	}
	if ((rc = nc->ZstdGetTempSize(n, max, opts, &temp, total, st))) {
		rc = sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressGetTempSize: status %d", rc);
		goto out;
	}
	if ((temp && (rc = SL_CU(cu->MemAlloc(&d_temp, temp), "cuMemAlloc (nvCOMP temporary)"))) ||
	    (rc = SL_CU(cu->MemcpyHtoD(d_arr, h, arr), "cuMemcpyHtoD (nvCOMP arguments)")))
		goto out;
	{
		const uint64_t A = d_arr;

		rc = nc->ZstdDecompressAsync((const void *const *)(uintptr_t)A, (const size_t *)(uintptr_t)(A + 8 * n),
					     (const size_t *)(uintptr_t)(A + 16 * n), (size_t *)(uintptr_t)(A + 24 * n), n,
					     (void *)(uintptr_t)d_temp, temp, (void *const *)(uintptr_t)(A + 32 * n), opts,
					     (int *)(uintptr_t)(A + 40 * n), st);
	}
	if (rc) {
		rc = sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressAsync: status %d", rc);
		goto out;
	}
	if (!(rc = SL_CU(cu->StreamSynchronize(st), "cuStreamSynchronize (nvCOMP)")) &&
	    !(rc = SL_CU(cu->MemcpyDtoH(h, d_arr, arr), "cuMemcpyDtoH (nvCOMP results)")))
		rc = sl_nv_results(cu, h, blk, n, file, dst, misaligned ? d_scratch : 0);
out:
	if (d_temp)
		cu->MemFree(d_temp);
	if (d_scratch)
		cu->MemFree(d_scratch);
	if (d_arr)
		cu->MemFree(d_arr);
	if (st)
		cu->StreamDestroy(st);
	free(h);
	return rc;
}

/*
 * The decoder of a zstd shard into dst: as asked (SLUICE_DECODE for
 * auto), nvCOMP (*nc) where dst is GPU memory and it loads, else the CPU;
 * rep says which, and why not the GPU.  An error where GPU decoding was
 * asked for and cannot be.
 */
static int sl_pick_decoder(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, const void *dst,
			   int decoder, struct sluice_shard_report *rep, const struct sl__nvcomp_api **nc)
{
	static const int by_word[] = { SLUICE_DECODE_AUTO, SLUICE_DECODE_GPU, SLUICE_DECODE_CPU };
	int gpu = sluice_is_gpu_ptr(eng, dst);
	const char *why = "";
	uint64_t w;
	int rc;

	*nc = NULL;
	if (decoder == SLUICE_DECODE_AUTO) {
		if ((rc = sl__setting_u64("SLUICE_DECODE", &w)))
			return rc;
		decoder = by_word[w];
	}
	if (decoder != SLUICE_DECODE_CPU) {
		*nc = gpu ? sl__nvcomp(&why) : NULL;
		if (!gpu)
			why = "the destination is host memory";
		if (!*nc && decoder == SLUICE_DECODE_GPU)
			return sl__err(SLUICE_ENOGPU, "%s: shard %u: GPU decoding asked for, but %s", ds->path, shard, why);
		snprintf(rep->why_not_gpu, sizeof(rep->why_not_gpu), "%s", *nc ? "" : why);
	}
	snprintf(rep->decoder, sizeof(rep->decoder), *nc ? "gpu" : "cpu");
	return 0;
}

/* A zstd shard's stored bytes read into GPU memory, then decoded there by nvCOMP; *t0 restarts for the decode. */
static int sl_shard_gpu(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, const char *path,
			const struct sl__block *blk, uint64_t nb, const struct sl__nvcomp_api *nc, void *dst,
			struct sluice_shard_report *rep, uint64_t *t0)
{
	uint64_t base = blk[0].file;
	void *in = NULL;
	ssize_t got;
	int rc;

	if ((rc = sluice_gpu_alloc(eng, rep->stored, &in)))
		return rc;
	got = sluice_read_to_gpu(eng, path, base, rep->stored, in, NULL);
	rep->read_s = (double)(sl__now_ns() - *t0) / 1e9;
	*t0 = sl__now_ns();
	rc = got < 0 ? (int)got : sl_decode_gpu(eng, nc, blk, nb, base, ds->files[shard], dst, (sl_CUdeviceptr)(uintptr_t)in);
	sluice_gpu_free(eng, in);
	return rc;
}

/*
 * A zstd shard's stored bytes read into pinned host memory, decoded by the
 * CPU (into dst, or a pinned staging copied on to dst in GPU memory); *t0
 * restarts for the decode.
 */
static int sl_shard_cpu(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, const char *path,
			const struct sl__block *blk, uint64_t nb, uint64_t logical, void *dst,
			struct sluice_shard_report *rep, uint64_t *t0)
{
	int pinned = 0, opinned = 0, ongpu = sluice_is_gpu_ptr(eng, dst), rc;
	struct sl__zblock *zb = calloc(nb, sizeof(*zb));
	void *in = NULL, *out = ongpu ? NULL : dst;
	uint64_t base = blk[0].file;

	if (!zb)
		return -ENOMEM;
	for (uint64_t k = 0; k < nb; k++)
		zb[k] = (struct sl__zblock){ &blk[k], shard, k, blk[k].logical - SL_ALIGN };
	if (!(rc = sl__host_alloc(sl__eng_gpu(eng), rep->stored, &in, &pinned)) &&
	    !(rc = ongpu ? sl__host_alloc(sl__eng_gpu(eng), logical, &out, &opinned) : 0)) {
		ssize_t got = sluice_read_to_gpu(eng, path, base, rep->stored, in, NULL);

		rep->read_s = (double)(sl__now_ns() - *t0) / 1e9;
		*t0 = sl__now_ns();
		rc = got < 0 ? (int)got : sl__zdecode(eng, ds, zb, nb, in, base, out);
		if (!rc && ongpu)
			rc = sluice_gpu_copy(eng, dst, out, logical);
	}
	if (ongpu && out)
		sl__host_free(sl__eng_gpu(eng), out, logical, opinned);
	if (in)
		sl__host_free(sl__eng_gpu(eng), in, rep->stored, pinned);
	free(zb);
	return rc;
}

ssize_t sluice_dataset_read_shard(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, void *dst,
				  size_t cap, int decoder, struct sluice_shard_report *rep)
{
	struct sluice_shard_report mine = SLUICE_SHARD_REPORT_INIT;
	const struct sl__block *blk = NULL;
	const struct sl__nvcomp_api *nc = NULL;
	uint64_t nb = 0, records, logical, t0;
	char path[4096];
	int rc;

	if ((rc = SL_REPORT_IN(rep, shard_report)))
		return rc;
	if (!rep)
		rep = &mine;
	if (strcmp(ds->ops->name, "sluice"))
		return sl__err(-ENOTSUP, "%s: a %s dataset: whole shards are read from sluice datasets", ds->path, ds->ops->name);
	if ((rc = sluice_dataset_shard_info(ds, shard, &records, &logical)))
		return rc;
	logical = logical > SL_ALIGN ? logical - SL_ALIGN : 0; /* the records' span after the header */
	if (logical > cap)
		return sl__err(-ENOSPC, "%s: shard %u holds %llu bytes, the buffer %zu", ds->path, shard,
			       (unsigned long long)logical, cap);
	if ((rc = sl__ds_path(ds, shard, path, sizeof(path))))
		return rc;
	rep->bytes = logical;
	t0 = sl__now_ns();
	if (!ds->compressed) {
		ssize_t got = logical ? sluice_read_to_gpu(eng, path, SL_ALIGN, logical, dst, NULL) : 0;

		rep->read_s = (double)(sl__now_ns() - t0) / 1e9;
		rep->stored = logical;
		snprintf(rep->decoder, sizeof(rep->decoder), "none");
		return got < 0 ? got : (ssize_t)logical;
	}
	if ((rc = ds->ops->blocks(ds, shard, &blk, &nb)))
		return rc;
	if (!nb)
		return 0;
	rep->blocks = (unsigned)nb;
	rep->stored = blk[nb - 1].file + blk[nb - 1].stored - blk[0].file;
	if ((rc = sl_pick_decoder(eng, ds, shard, dst, decoder, rep, &nc)))
		return rc;
	rc = nc ? sl_shard_gpu(eng, ds, shard, path, blk, nb, nc, dst, rep, &t0)
		: sl_shard_cpu(eng, ds, shard, path, blk, nb, logical, dst, rep, &t0);
	rep->decode_s = (double)(sl__now_ns() - t0) / 1e9;
	return rc ? rc : (ssize_t)logical;
}
