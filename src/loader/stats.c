/*
 * The loader's statistics: per-stage histograms as JSON, the periodic
 * SLUICE_STATS log line, and the verdict on where the time goes.  The
 * SLUICE_TRACE spans are written by sl__ld_span (loader.h) and core/trace.c.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "loader/state.h"
#include "diag/diag.h"
#include "engine/engine.h"

/*
 * Where the time goes: the loader's own time per batch (storage and collation, then the copy)
 * against the consumer's step time (its time between calls, waits
 * excluded) and the share of the consumer's time spent waiting (the GPU
 * idle, when the consumer is a training loop).
 */
struct sl_verdict {
	double wait_share, wait_share_all, step_us, produce_us, h2d_us; /* wait_share leaves out the fills */
	const char *verdict;
};

const char *sl__verdict_rule(double wait_share, double produce_us, double step_us, int gpu)
{
	if (wait_share < 0.05)
		return "compute-bound";
	if (produce_us > step_us || !gpu)
		return "loader-bound";
	return "transfer-bound";
}

static struct sl_verdict sl_verdict(const struct sluice_loader *ld)
{
	struct sl_verdict v = { 0, 0, 0, 0, 0, "no batches yet" };
	uint64_t nb = atomic_load(&ld->h_wait.n), wait = atomic_load(&ld->h_wait.sum);
	double wall = (double)(ld->t_last - ld->t_first);
	uint64_t made = atomic_load(&ld->h_collate.n);

	if (nb < 2 || !made)
		return v;
	v.wait_share_all = wall > 0 ? (double)wait / wall : 0;
	v.wait_share = wall > (double)ld->fill_ns ? (double)(wait - ld->fill_ns) / (wall - (double)ld->fill_ns) : 0;
	v.step_us = (wall - (double)wait) / (double)(nb - 1) / 1e3;
	v.produce_us = (double)(atomic_load(&ld->h_read.sum) + atomic_load(&ld->h_collate.sum)) / (double)made / 1e3;
	v.h2d_us = ld->opt.gpu ? (double)atomic_load(&ld->h_h2d.sum) / (double)made / 1e3 : 0;
	v.verdict = sl__verdict_rule(v.wait_share, v.produce_us, v.step_us, ld->opt.gpu != 0);
	return v;
}

void sl__loader_log_stats(struct sluice_loader *ld)
{
	struct sl_verdict v = sl_verdict(ld);

	ld->t_logged = ld->t_last;
	sl__stat("loader", "batch %llu: GPU wait %.1f%%, step %.0f us, loader %.0f us (h2d %.0f us) a batch: %s",
		 (unsigned long long)ld->next_g, 100 * v.wait_share, v.step_us, v.produce_us, v.h2d_us, v.verdict);
}

void sl__loader_publish(struct sluice_loader *ld)
{
	struct sl_verdict v;
	struct sluice_loader_figures f;

	if (!ld->pub)
		return;
	v = sl_verdict(ld);
	memset(&f, 0, sizeof(f));
	f.batches = ld->delivered;
	f.records = ld->delivered_records;
	f.bytes = ld->delivered_bytes;
	f.read_bytes = atomic_load(&ld->read_bytes);
	f.read_ios = atomic_load(&ld->read_ios);
	f.read_bytes_cached = atomic_load(&ld->read_cached);
	sluice_object_cache_counts(&f.object_cache_hits, &f.object_cache_misses);
	f.wall_s = (double)(ld->t_last - ld->t_first) / 1e9;
	f.read_s = (double)atomic_load(&ld->h_read.sum) / 1e9;
	f.decompress_s = (double)atomic_load(&ld->ds->h_decompress.sum) / 1e9;
	f.storage_wait_s = (double)atomic_load(&ld->h_swait.sum) / 1e9;
	f.collate_s = (double)atomic_load(&ld->h_collate.sum) / 1e9;
	f.h2d_s = (double)atomic_load(&ld->h_h2d.sum) / 1e9;
	f.consumer_wait_s = (double)atomic_load(&ld->h_wait.sum) / 1e9;
	f.gpu_wait_share = v.wait_share;
	snprintf(f.verdict, sizeof(f.verdict), "%s", v.verdict);
	sl__pub_update(ld->pub, &f);
}

size_t sluice_loader_stats_json(struct sluice_loader *ld, char *buf, size_t cap)
{
	const struct sl__hist *h[] = { &ld->h_read, &ld->ds->h_decompress, &ld->h_zread, &ld->h_zdecode, &ld->h_swait,
				       &ld->h_collate, &ld->h_h2d, &ld->h_wait };
	static const char *const name[] = { "read", "decompress", "zstd_window_read", "zstd_window_decode",
					    "storage_wait", "collate", "h2d", "consumer_wait" };
	size_t l = 0;

#define SL_PUT(...) (l += (size_t)snprintf(buf + (l < cap ? l : cap), l < cap ? cap - l : 0, __VA_ARGS__))
	uint64_t all = atomic_load(&ld->record_bytes), hits, misses, held_moved, held_bytes;
	struct sl__stage_counts c;

	sluice_object_cache_counts(&hits, &misses);
	sl__stages_count(ld, &c);
	pthread_mutex_lock(&ld->lock);
	held_moved = ld->held_moved;
	held_bytes = ld->held_bytes;
	pthread_mutex_unlock(&ld->lock);

	SL_PUT("{\"batches\":%llu,\"records\":%llu,\"bytes\":%llu,\"window_records\":%llu,"
	       "\"read_bytes\":%llu,\"read_bytes_cached\":%llu,\"object_cache_hits\":%llu,\"object_cache_misses\":%llu,"
	       "\"read_ios\":%llu,\"sequential_fraction\":%.4f,\"skipped\":%llu,"
	       "\"images_gpu\":%llu,\"images_cpu\":%llu,\"zstd_blocks_gpu\":%llu,\"zstd_blocks_cpu\":%llu,"
	       "\"windows_read_ahead\":%llu,\"held_moved\":%llu,\"held_bytes\":%llu,"
	       "\"cuda_calls_producers\":%llu,\"cuda_calls_consumer\":%llu,\"nvjpeg_calls\":%llu,",
	       (unsigned long long)ld->delivered, (unsigned long long)atomic_load(&ld->records),
	       (unsigned long long)atomic_load(&ld->bytes), (unsigned long long)ld->window,
	       (unsigned long long)atomic_load(&ld->read_bytes), (unsigned long long)atomic_load(&ld->read_cached),
	       (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)atomic_load(&ld->read_ios),
	       all ? (double)atomic_load(&ld->seq_bytes) / (double)all : 0.0, (unsigned long long)atomic_load(&ld->skipped),
	       (unsigned long long)c.images_gpu, (unsigned long long)c.images_cpu,
	       (unsigned long long)atomic_load(&ld->zblocks_gpu), (unsigned long long)atomic_load(&ld->zblocks_cpu),
	       (unsigned long long)ld->preloaded, (unsigned long long)held_moved, (unsigned long long)held_bytes,
	       (unsigned long long)atomic_load(&ld->cu_prod), (unsigned long long)atomic_load(&ld->cu_cons),
	       (unsigned long long)c.nvjpeg_calls);
	/* A GPU image pipeline's host time a batch, by phase (enum sl__img_phase's order). */
	static const char *const phase[SL_IMG_PHASES] = { "last_batch_wait", "parse", "lane_wait", "shared_decode_wait",
							  "nvjpeg", "nvjpeg_read_wait", "cpu_decode", "augment" };
	const double nbg = c.image_batches_gpu ? (double)c.image_batches_gpu : 1;

	SL_PUT("\"image_batches_gpu\":%llu,\"image_us\":{", (unsigned long long)c.image_batches_gpu);
	for (unsigned k = 0; k < SL_IMG_PHASES; k++)
		SL_PUT("%s\"%s\":%.1f", k ? "," : "", phase[k], (double)c.image_ns[k] / nbg / 1e3);
	SL_PUT("},\"stages\":{");
	for (unsigned i = 0; i < sizeof(h) / sizeof(h[0]); i++)
		SL_PUT("%s\"%s\":{\"count\":%llu,\"total_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f}", i ? "," : "", name[i],
		       (unsigned long long)atomic_load(&h[i]->n), (double)atomic_load(&h[i]->sum) / 1e3,
		       (double)sl__hist_percentile(h[i], 50) / 1e3, (double)sl__hist_percentile(h[i], 99) / 1e3);
	struct sl_verdict v = sl_verdict(ld);

	SL_PUT("},\"gpu_wait_share\":%.4f,\"fill_us\":%.1f,\"gpu_wait_share_with_fill\":%.4f,\"step_us\":%.1f,"
	       "\"loader_us\":%.1f,\"h2d_us\":%.1f,\"verdict\":\"%s\"}",
	       v.wait_share, (double)ld->fill_ns / 1e3, v.wait_share_all, v.step_us, v.produce_us, v.h2d_us, v.verdict);
#undef SL_PUT
	return l;
}
