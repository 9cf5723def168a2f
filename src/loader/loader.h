/*
 * loader: batches of dataset records for a training loop (order.c: which
 * records, loader.c: reading, collating and delivering them).
 */
#ifndef SL_LOADER_H
#define SL_LOADER_H

#include "core/core.h"

/* A deterministic epoch order (order.c).  Only (seed, epoch, window, chunk) and the shard sizes decide it. */
struct sl__order {
	uint64_t n;          /* records */
	uint64_t epoch;
	uint64_t window;     /* records per shuffle window */
	uint64_t chunk;      /* records per chunk: windows are made of chunks from all over the dataset */
	uint64_t nchunks;    /* whole chunks, which are permuted; the records after them stay last */
	uint64_t key, chunk_key;
	unsigned nshards;
	unsigned *perm;      /* shard order */
	uint64_t *start;     /* position in the permuted sequence where perm[s] starts; [nshards] = n */
	uint64_t *first;     /* global id of each shard's first record */
};
SL_HIDDEN int sl__order_init(struct sl__order *o, const uint64_t *shard_records, unsigned nshards,
			     uint64_t seed, uint64_t epoch, uint64_t window, uint64_t chunk);
SL_HIDDEN void sl__order_free(struct sl__order *o);
/* The record at position p (< n) of the epoch. */
SL_HIDDEN uint64_t sl__order_at(const struct sl__order *o, uint64_t p);

#endif
