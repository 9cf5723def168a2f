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
 * nvCOMP (zgpu.c): every block decoded by one batched call into its place
 * in dst, or through a scratch when any place is misaligned for nvCOMP.
 */
static int sl_decode_gpu(struct sluice_engine *eng, const struct sl__nvcomp_api *nc, const struct sl__block *blk,
			 uint64_t n, uint64_t base, const char *file, char *dst, sl_CUdeviceptr in)
{
	const struct sl__cuda_api *cu = sl__eng_gpu(eng)->cu;
	struct sl__zgpu_item *it = malloc((n ? n : 1) * sizeof(*it));
	struct sl__zgpu *z = NULL;
	uint64_t sc = 0, bad;
	int misaligned = 0, rc = it ? sl__zgpu_open(&z, sl__eng_gpu(eng), nc) : -ENOMEM;

	for (uint64_t k = 0; !rc && k < n; k++) {
		misaligned |= z->al.output > 1 && (uintptr_t)(dst + (blk[k].logical - SL_ALIGN)) % z->al.output;
		misaligned |= z->al.input > 1 && (blk[k].file - base) % z->al.input;
		sc += sl__align_up(blk[k].len, SL_ZGPU_ALIGN);
	}
	if (!rc && misaligned)
		rc = sl__gbuf_room(z->g, &z->out_dev, sc + 1, 1, "nvCOMP output");
	sc = 0;
	for (uint64_t k = 0; !rc && k < n; k++) {
		char *place = dst + (blk[k].logical - SL_ALIGN);

		it[k] = (struct sl__zgpu_item){ in + (blk[k].file - base),
						misaligned ? (uint64_t)(uintptr_t)z->out_dev.p + sc : (uint64_t)(uintptr_t)place,
						blk[k].stored, blk[k].len };
		sc += sl__align_up(blk[k].len, SL_ZGPU_ALIGN);
	}
	if (!rc && (rc = sl__zgpu_run(z, it, n, &bad)) == SLUICE_EFORMAT)
		rc = sl__err(rc, "%s: block %llu: %s", file, (unsigned long long)bad, sluice_last_error_detail());
	for (uint64_t k = 0; !rc && misaligned && k < n; k++)
		rc = SL_CU(cu->Memcpy((sl_CUdeviceptr)(uintptr_t)(dst + (blk[k].logical - SL_ALIGN)), it[k].out,
				      blk[k].len), "cuMemcpy (nvCOMP output)");
	sl__zgpu_close(z);
	free(it);
	return rc;
}

/*
 * The decoder of a zstd shard into dst: as asked (SLUICE_DECODE for
 * auto), nvCOMP (*nc) where dst is GPU memory and it loads, else the CPU;
 * rep says which, and why not the GPU.  An error where GPU decoding was
 * asked for and cannot be.
 */
static int sl_pick_decoder(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, const void *dst,
			   const struct sl__block *blk, uint64_t nb, int decoder, struct sluice_shard_report *rep,
			   const struct sl__nvcomp_api **nc)
{
	static const int by_word[] = { SLUICE_DECODE_AUTO, SLUICE_DECODE_GPU, SLUICE_DECODE_CPU };
	int gpu = sluice_is_gpu_ptr(eng, dst);
	const char *why = "";
	uint64_t w;
	int rc;

	/* nvCOMP trusts its input: only blocks whose stored bytes can be checked first go to it. */
	for (uint64_t k = 0; k < nb && gpu; k++)
		if (!blk[k].has_crc) {
			gpu = 0;
			why = "its zstd blocks carry no CRC of their stored bytes (packed by an older sluice: pack it again)";
		}

	*nc = NULL;
	if (decoder == SLUICE_DECODE_AUTO) {
		if ((rc = sl__setting_u64("SLUICE_DECODE", &w)))
			return rc;
		decoder = by_word[w];
	}
	if (decoder != SLUICE_DECODE_CPU) {
		*nc = gpu ? sl__nvcomp(&why) : NULL;
		if (!gpu && !*why)
			why = "the destination is host memory";
		if (!*nc && decoder == SLUICE_DECODE_GPU)
			return sl__err(SLUICE_ENOGPU, "%s: shard %u: GPU decoding asked for, but %s", ds->path, shard, why);
		snprintf(rep->why_not_gpu, sizeof(rep->why_not_gpu), "%s", *nc ? "" : why);
	}
	snprintf(rep->decoder, sizeof(rep->decoder), *nc ? "gpu" : "cpu");
	return 0;
}

/*
 * A zstd shard's stored bytes read into GPU memory, each block checked by
 * its CRC on the way, then decoded there by nvCOMP; *t0 restarts for the
 * decode.
 */
static int sl_shard_gpu(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard,
			const struct sl__block *blk, uint64_t nb, const struct sl__nvcomp_api *nc, void *dst,
			struct sluice_shard_report *rep, uint64_t *t0)
{
	struct sl__zblock *zb = malloc(nb * sizeof(*zb));
	void **to = malloc(nb * sizeof(*to));
	uint64_t base = blk[0].file;
	char *in = NULL;
	int rc = zb && to ? sluice_gpu_alloc(eng, rep->stored, (void **)&in) : -ENOMEM;

	for (uint64_t k = 0; k < nb && !rc; k++) {
		zb[k] = (struct sl__zblock){ &blk[k], shard, k, 0 };
		to[k] = in + (blk[k].file - base);
	}
	if (!rc)
		rc = sl__read_blocks(eng, ds, zb, nb, to, NULL);
	rep->read_s = (double)(sl__now_ns() - *t0) / 1e9;
	*t0 = sl__now_ns();
	if (!rc)
		rc = sl_decode_gpu(eng, nc, blk, nb, base, ds->files[shard], dst, (sl_CUdeviceptr)(uintptr_t)in);
	sluice_gpu_free(eng, in);
	free(zb);
	free(to);
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
		rc = logical ? sl__read_shard_records(eng, ds, shard, dst, logical, NULL) : 0;
		rep->read_s = (double)(sl__now_ns() - t0) / 1e9;
		rep->stored = logical;
		snprintf(rep->decoder, sizeof(rep->decoder), "none");
		return rc ? rc : (ssize_t)logical;
	}
	if ((rc = ds->ops->blocks(ds, shard, &blk, &nb)))
		return rc;
	if (!nb)
		return 0;
	rep->blocks = (unsigned)nb;
	rep->stored = blk[nb - 1].file + blk[nb - 1].stored - blk[0].file;
	if ((rc = sl_pick_decoder(eng, ds, shard, dst, blk, nb, decoder, rep, &nc)))
		return rc;
	rc = nc ? sl_shard_gpu(eng, ds, shard, blk, nb, nc, dst, rep, &t0)
		: sl_shard_cpu(eng, ds, shard, path, blk, nb, logical, dst, rep, &t0);
	rep->decode_s = (double)(sl__now_ns() - t0) / 1e9;
	return rc ? rc : (ssize_t)logical;
}
