/* Lock-free latency histogram (see struct sl__hist). */
#include <string.h>

#include "core.h"

static unsigned sl_bucket(uint64_t v)
{
	if (v < SL_HIST_SUB)
		return (unsigned)v;
	unsigned msb = 63u - (unsigned)__builtin_clzll(v);
	unsigned sub = (unsigned)(v >> (msb - 4)) & (SL_HIST_SUB - 1);

	return (msb - 3) * SL_HIST_SUB + sub;
}

/* Smallest value that falls into bucket b. */
static uint64_t sl_bucket_low(unsigned b)
{
	if (b < SL_HIST_SUB)
		return b;
	unsigned msb = b / SL_HIST_SUB + 3;

	return (1ull << msb) | ((uint64_t)(b % SL_HIST_SUB) << (msb - 4));
}

void sl__hist_add(struct sl__hist *h, uint64_t v)
{
	uint64_t m = atomic_load_explicit(&h->max, memory_order_relaxed);

	atomic_fetch_add_explicit(&h->count[sl_bucket(v)], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->n, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
	while (v > m && !atomic_compare_exchange_weak(&h->max, &m, v))
		;
}

uint64_t sl__hist_percentile(const struct sl__hist *h, double p)
{
	uint64_t n = atomic_load(&h->n), seen = 0;

	if (!n)
		return 0;
	uint64_t want = (uint64_t)(p / 100.0 * (double)n + 0.5);

	if (want < 1)
		want = 1;
	for (unsigned b = 0; b < SL_HIST_BUCKETS; b++) {
		seen += atomic_load_explicit(&h->count[b], memory_order_relaxed);
		if (seen >= want) {
			/* Report the middle of the bucket, capped at the max. */
			uint64_t lo = sl_bucket_low(b), hi = sl_bucket_low(b + 1);
			uint64_t mid = lo + (hi - lo) / 2, mx = atomic_load(&h->max);

			return mid < mx ? mid : mx;
		}
	}
	return atomic_load(&h->max);
}

void sl__hist_reset(struct sl__hist *h)
{
	for (unsigned b = 0; b < SL_HIST_BUCKETS; b++)
		atomic_store_explicit(&h->count[b], 0, memory_order_relaxed);
	atomic_store(&h->n, 0);
	atomic_store(&h->sum, 0);
	atomic_store(&h->max, 0);
}
