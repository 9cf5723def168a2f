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
#include <zstd.h>

#include "format/format.h"
#include "xfer/xfer.h"

struct sl_zjob {
	const struct sl__block *b;
	uint64_t n, base_file;     /* blocks; the file offset of the stored bytes' start */
	const char *in;            /* the stored bytes */
	char *out;                 /* the logical bytes (block k at b[k].logical - 4096) */
	const char *file;
	_Atomic uint64_t next;
	_Atomic int err;
	char detail[256];
};

static void *sl_zworker(void *arg)
{
	struct sl_zjob *j = arg;
	ZSTD_DCtx *dc = ZSTD_createDCtx();
	uint64_t k;

	if (!dc) {
		atomic_store(&j->err, -ENOMEM);
		return NULL;
	}
	while (!atomic_load(&j->err) && (k = atomic_fetch_add(&j->next, 1)) < j->n) {
		const struct sl__block *b = &j->b[k];
		size_t got = ZSTD_decompressDCtx(dc, j->out + (b->logical - SL_ALIGN), b->len, j->in + (b->file - j->base_file),
						 b->stored);
		int zero = 0;

		if ((ZSTD_isError(got) || got != b->len) && atomic_compare_exchange_strong(&j->err, &zero, SLUICE_EFORMAT))
			snprintf(j->detail, sizeof(j->detail), "%s: block %llu: %s", j->file, (unsigned long long)k,
				 ZSTD_isError(got) ? ZSTD_getErrorName(got) : "decoded size differs from the block table");
	}
	ZSTD_freeDCtx(dc);
	return NULL;
}

static int sl_decode_cpu(struct sluice_engine *eng, struct sl_zjob *j, void *dst, uint64_t logical)
{
	int gpu = sluice_is_gpu_ptr(eng, dst), pinned = 0, rc = 0;
	unsigned nt = eng->cfg.threads < j->n ? eng->cfg.threads : (unsigned)j->n;
	pthread_t th[256];
	void *host = dst;

	if (gpu && (rc = sl__host_alloc(&eng->gpu, logical, &host, &pinned)))
		return rc;
	j->out = host;
	for (unsigned t = 0; t < nt; t++)
		if (pthread_create(&th[t], NULL, sl_zworker, j)) {
			atomic_store(&j->err, -EAGAIN);
			nt = t;
			break;
		}
	sl_zworker(j); /* this thread too */
	for (unsigned t = 0; t < nt; t++)
		pthread_join(th[t], NULL);
	rc = atomic_load(&j->err);
	if (rc)
		rc = sl__err(rc, "%s", j->detail[0] ? j->detail : "cannot start decoding threads");
	else if (gpu)
		rc = sluice_gpu_copy(eng, dst, host, logical);
	if (gpu)
		sl__host_free(&eng->gpu, host, logical, pinned);
	return rc;
}

/* nvCOMP: every block decoded by one batched call into its place in dst (or a scratch, when misaligned). */
static int sl_decode_gpu(struct sluice_engine *eng, const struct sl__nvcomp_api *nc, struct sl_zjob *j, char *dst,
			 sl_CUdeviceptr in)
{
	const struct sl__cuda_api *cu = eng->gpu.cu;
	struct sl__nvcomp_opts opts;
	struct sl__nvcomp_align al;
	uint64_t n = j->n, max = 0, total = 0, scratch_len = 0;
	size_t temp = 0, arr = n * (5 * sizeof(uint64_t) + sizeof(int));
	uint64_t *h = calloc(1, arr + 1);
	sl_CUdeviceptr d_arr = 0, d_temp = 0, d_scratch = 0;
	sl_CUstream st = NULL;
	int rc, misaligned = 0;

	memset(&opts, 0, sizeof(opts));
	if (!h)
		return -ENOMEM;
	if ((rc = nc->ZstdGetRequiredAlignments(opts, &al))) {
		rc = sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressGetRequiredAlignments: status %d", rc);
		goto out;
	}
	for (uint64_t k = 0; k < n; k++) {
		max = j->b[k].len > max ? j->b[k].len : max;
		total += j->b[k].len;
		misaligned |= al.output > 1 && (uintptr_t)(dst + (j->b[k].logical - SL_ALIGN)) % al.output;
		misaligned |= al.input > 1 && (j->b[k].file - j->base_file) % al.input;
		scratch_len += sl__align_up(j->b[k].len, 256);
	}
	if ((rc = sl__gpu_bind(&eng->gpu)) || (rc = SL_CU(cu->StreamCreate(&st, 1), "cuStreamCreate")) ||
	    (rc = SL_CU(cu->MemAlloc(&d_arr, arr), "cuMemAlloc (nvCOMP arguments)")))
		goto out;
	if (misaligned && (rc = SL_CU(cu->MemAlloc(&d_scratch, scratch_len), "cuMemAlloc (nvCOMP output)")))
		goto out;
	/* h: in pointers, in sizes, out capacities, out sizes (filled by nvCOMP), out pointers, statuses. */
	for (uint64_t k = 0, sc = 0; k < n; k++) {
		h[k] = in + (j->b[k].file - j->base_file);
		h[n + k] = j->b[k].stored;
		h[2 * n + k] = j->b[k].len;
		h[4 * n + k] = misaligned ? d_scratch + sc : (uint64_t)(uintptr_t)(dst + (j->b[k].logical - SL_ALIGN));
		sc += sl__align_up(j->b[k].len, 256);
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
	if ((rc = SL_CU(cu->StreamSynchronize(st), "cuStreamSynchronize (nvCOMP)")) ||
	    (rc = SL_CU(cu->MemcpyDtoH(h, d_arr, arr), "cuMemcpyDtoH (nvCOMP results)")))
		goto out;
	for (uint64_t k = 0; k < n; k++) {
		int status = ((int *)(h + 5 * n))[k];

		if (status || h[3 * n + k] != j->b[k].len) {
			rc = sl__err(SLUICE_EFORMAT, "%s: block %llu: nvCOMP status %d, %llu bytes decoded of %u", j->file,
				     (unsigned long long)k, status, (unsigned long long)h[3 * n + k], j->b[k].len);
			goto out;
		}
	}
	for (uint64_t k = 0, sc = 0; misaligned && k < n; k++) {
		if ((rc = SL_CU(cu->Memcpy((sl_CUdeviceptr)(uintptr_t)(dst + (j->b[k].logical - SL_ALIGN)), d_scratch + sc,
					   j->b[k].len), "cuMemcpy (nvCOMP output)")))
			goto out;
		sc += sl__align_up(j->b[k].len, 256);
	}
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

ssize_t sluice_dataset_read_shard(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, void *dst,
				  size_t cap, int decoder, struct sluice_shard_report *rep)
{
	struct sluice_shard_report mine;
	struct sl_zjob j;
	const struct sl__nvcomp_api *nc = NULL;
	const char *why = "";
	char path[4096];
	uint64_t records, logical, t0;
	int gpu, rc;

	if (!rep)
		rep = &mine;
	memset(rep, 0, sizeof(*rep));
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
	memset(&j, 0, sizeof(j));
	if ((rc = ds->ops->blocks(ds, shard, &j.b, &j.n)))
		return rc;
	if (!j.n)
		return 0;
	j.base_file = j.b[0].file;
	j.file = ds->files[shard];
	rep->blocks = (unsigned)j.n;
	rep->stored = j.b[j.n - 1].file + j.b[j.n - 1].stored - j.base_file;
	gpu = sluice_is_gpu_ptr(eng, dst);
	if (decoder == SLUICE_DECODE_AUTO) {
		const char *v = sl__setting("SLUICE_DECODE");

		decoder = !v || !*v || !strcmp(v, "auto") ? SLUICE_DECODE_AUTO
			  : !strcmp(v, "gpu")		   ? SLUICE_DECODE_GPU
			  : !strcmp(v, "cpu")		   ? SLUICE_DECODE_CPU
							   : -1;
		if (decoder < 0)
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_DECODE=\"%s\" (%s) is not auto, gpu or cpu", v,
				       sl__setting_from("SLUICE_DECODE"));
	}
	if (decoder != SLUICE_DECODE_CPU) {
		nc = gpu ? sl__nvcomp(&why) : NULL;
		if (!gpu)
			why = "the destination is host memory";
		if (!nc && decoder == SLUICE_DECODE_GPU)
			return sl__err(SLUICE_ENOGPU, "%s: shard %u: GPU decoding asked for, but %s", ds->path, shard, why);
		snprintf(rep->why_not_gpu, sizeof(rep->why_not_gpu), "%s", nc ? "" : why);
	}
	snprintf(rep->decoder, sizeof(rep->decoder), nc ? "gpu" : "cpu");
	if (nc) {
		void *in = NULL;

		if ((rc = sluice_gpu_alloc(eng, rep->stored, &in)))
			return rc;
		{
			ssize_t got = sluice_read_to_gpu(eng, path, j.base_file, rep->stored, in, NULL);

			rep->read_s = (double)(sl__now_ns() - t0) / 1e9;
			t0 = sl__now_ns();
			rc = got < 0 ? (int)got : sl_decode_gpu(eng, nc, &j, dst, (sl_CUdeviceptr)(uintptr_t)in);
		}
		sluice_gpu_free(eng, in);
	} else {
		int pinned = 0;
		void *in = NULL;

		if ((rc = sl__host_alloc(&eng->gpu, rep->stored, &in, &pinned)))
			return rc;
		{
			ssize_t got = sluice_read_to_gpu(eng, path, j.base_file, rep->stored, in, NULL);

			rep->read_s = (double)(sl__now_ns() - t0) / 1e9;
			t0 = sl__now_ns();
			j.in = in;
			rc = got < 0 ? (int)got : sl_decode_cpu(eng, &j, dst, logical);
		}
		sl__host_free(&eng->gpu, in, rep->stored, pinned);
	}
	rep->decode_s = (double)(sl__now_ns() - t0) / 1e9;
	return rc ? rc : (ssize_t)logical;
}
