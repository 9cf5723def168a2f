/*
 * dsread: reading a dataset's records and shards through the engine:
 * batches of records (dsread.c) and whole shards, decoded on the GPU
 * (nvCOMP) or the CPU (shard.c).  Above both engine/ and format/.
 */
#ifndef SL_DSREAD_H
#define SL_DSREAD_H

#include "engine/engine.h"
#include "format/format.h"

/*
 * bind.c: the engine's handle of shard's data file, bound to eng once for
 * the dataset (opened on its first use, kept until the engine closes or
 * it is the least recently used of 256), held by the caller until
 * sl__bind_release; 0 or the open's error.  sl__bind_opens: the files eng
 * has opened for datasets so far (tests).
 */
SL_HIDDEN int sl__bind_file(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard,
			    struct sluice_file **out);
SL_HIDDEN void sl__bind_release(struct sluice_engine *eng, struct sluice_file *f);
SL_HIDDEN uint64_t sl__bind_opens(struct sluice_engine *eng);

/* One zstd block to decode (sl__zdecode): its table entry, shard and index there, and where it lands. */
struct sl__zblock {
	const struct sl__block *b;
	unsigned shard;
	uint64_t index;
	uint64_t out_off;
};
/*
 * Decodes the n blocks on the CPU (eng's thread count, this thread among
 * them): stored bytes from in (a shard's, read from its file offset base)
 * or, with in NULL, pread from the shard files; block k to out +
 * zb[k].out_off.  0, or SLUICE_EFORMAT / -errno naming the file and block.
 */
SL_HIDDEN int sl__zdecode(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb,
			  uint64_t n, const void *in, uint64_t base, void *out);

/*
 * The n blocks' stored bytes read by one engine job, block k to to[k]
 * (host or GPU memory), each checked against its CRC: 0, SLUICE_ECRC
 * naming the file and block, -EINVAL for a block without one.
 */
SL_HIDDEN int sl__read_blocks(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb,
			      uint64_t n, void *const *to, struct sluice_xfer_report *rep);
/*
 * An uncompressed shard's records, and the padding between them, to dst
 * (host or GPU memory; logical bytes from the shard's offset 4096) by one
 * engine job, each record's CRC checked: 0, or SLUICE_ECRC / SLUICE_EFORMAT
 * naming the file and record.
 */
SL_HIDDEN int sl__read_shard_records(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, char *dst,
				     uint64_t logical, struct sluice_xfer_report *rep);
/*
 * nvCOMP's batched zstd decoder with its stream and buffers kept from call
 * to call (zgpu.c).  Pointers and sizes SL_ZGPU_ALIGN-aligned suit it.
 */
#define SL_ZGPU_ALIGN 256
struct sl__zgpu {
	const struct sl__gpu *g;
	const struct sl__nvcomp_api *nc;
	struct sl__nvcomp_opts opts;
	struct sl__nvcomp_align al;           /* what nvCOMP wants, each at most SL_ZGPU_ALIGN */
	sl_CUstream st;
	struct sl__gbuf args, args_dev, temp; /* nvCOMP's arguments (pinned, GPU) and temporary */
	struct sl__gbuf in, in_dev;           /* callers': stored bytes, pinned and on the GPU */
	struct sl__gbuf out_dev, out;         /* callers': decoded bytes on the GPU, pinned */
};
/* One block: stored bytes at device address in, decoded to out (len bytes). */
struct sl__zgpu_item {
	uint64_t in, out;
	uint32_t stored, len;
};
SL_HIDDEN int sl__zgpu_open(struct sl__zgpu **out, const struct sl__gpu *g, const struct sl__nvcomp_api *nc);
SL_HIDDEN void sl__zgpu_close(struct sl__zgpu *z);
/*
 * The n blocks decoded by one batched call on z's stream, after the work
 * already queued there, and waited for: 0, or SLUICE_EFORMAT with *bad the
 * first block whose status or decoded size is wrong, or SLUICE_ECUDA.
 */
SL_HIDDEN int sl__zgpu_run(struct sl__zgpu *z, const struct sl__zgpu_item *it, uint64_t n, uint64_t *bad);
/*
 * sluice_dataset_read_batch with z non-NULL: a zstd dataset's blocks are
 * decoded by nvCOMP (z's) where they all carry CRCs, the records then
 * checked and copied out on the host as the CPU's are.  zr (if non-NULL)
 * gets what the zstd path did added to it.
 */
struct sl__zreport {
	uint64_t blocks_gpu, blocks_cpu; /* blocks decoded by nvCOMP, by the CPU */
	uint64_t read_ns;                /* nvCOMP's: the blocks' stored bytes read and their CRCs checked */
	uint64_t decode_ns;              /* nvCOMP's: up, decoded, back; the CPU's: read and decoded by its threads */
};
SL_HIDDEN ssize_t sl__dataset_read_batch(struct sluice_engine *eng, struct sluice_dataset *ds, const uint64_t *idx,
					 size_t n, void *dst, size_t cap, uint64_t *offsets,
					 struct sluice_xfer_report *rep, struct sl__zgpu *z, struct sl__zreport *zr);
#endif
