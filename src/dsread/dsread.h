/*
 * dsread: reading a dataset's records and shards through the engine:
 * batches of records (dsread.c) and whole shards, decoded on the GPU
 * (nvCOMP) or the CPU (shard.c).  Above both engine/ and format/.
 */
#ifndef SL_DSREAD_H
#define SL_DSREAD_H

#include "engine/engine.h"
#include "format/format.h"

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
#endif
