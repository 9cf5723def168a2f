/*
 * Planning: turns caller ranges into segments (storage I/Os) and pieces
 * (copies to or from caller memory), coalescing neighbours.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/pipeline.h"

/* A caller's range and its position in the caller's array. */
struct sl_ranged {
	struct sluice_range r;
	uint32_t orig;
};

static int sl_range_cmp(const void *a, const void *b)
{
	const struct sluice_range *x = &((const struct sl_ranged *)a)->r, *y = &((const struct sl_ranged *)b)->r;

	if (x->file != y->file)
		return (uintptr_t)x->file < (uintptr_t)y->file ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Checks a read range against the file size, refreshing a stale size. */
static int sl_check_range(const struct sluice_range *r)
{
	struct sluice_file *f = r->file;
	uint64_t size;

	if (r->offset + r->len <= atomic_load(&f->s.size) && r->offset + r->len >= r->offset)
		return 0;
	if (f->s.ops->stat && f->s.ops->stat(&f->s, &size) == 0)
		atomic_store(&f->s.size, size);
	if (r->offset + r->len <= atomic_load(&f->s.size) && r->offset + r->len >= r->offset)
		return 0;
	return sl__err(SLUICE_ERANGE, "%s: range [%llu, +%zu) passes the end of the file (%llu bytes)",
		       f->path, (unsigned long long)r->offset, r->len,
		       (unsigned long long)atomic_load(&f->s.size));
}

/*
 * The lane whose workers copy to or from GPU memory p: that of p's GPU
 * when the engine serves it (its own context, stream and PCIe link), else
 * lane 0 (the driver routes the copy).
 */
static int sl_lane_of(const struct sluice_engine *eng, const void *p)
{
	int ord = -1;

	if (eng->nlanes < 2 || eng->gpu.cu->PointerGetAttribute(&ord, 9 /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */,
								  (sl_CUdeviceptr)(uintptr_t)p))
		return 0;
	for (unsigned l = 0; l < eng->nlanes; l++)
		if (eng->lane[l]->ordinal == ord)
			return (int)l;
	return 0;
}

/* Each range checked (a file, a buffer, writable for writes, inside the file for reads); the segments it may take. */
static int sl_plan_check(const struct sl_ranged *rd, size_t n, int op, size_t chunk, size_t *maxsegs)
{
	int rc;

	*maxsegs = 0;
	for (size_t i = 0; i < n; i++) {
		struct sluice_file *f = rd[i].r.file;
		uint64_t size;

		if (!f || (!rd[i].r.buf && rd[i].r.len))
			return sl__err(-EINVAL, "range %zu: NULL file or buffer", i);
		if (op == SL_IO_WRITE && !f->writable)
			return sl__err(-EBADF, "%s: not opened for writing (SLUICE_RDWR)", f->path);
		/* Fresh size: padding is allowed only past it (see pad_ok). */
		if (op == SL_IO_WRITE && f->s.ops->stat(&f->s, &size) == 0)
			atomic_store(&f->s.size, size);
		if (op == SL_IO_READ && (rc = sl_check_range(&rd[i].r)))
			return rc;
		*maxsegs += rd[i].r.len / chunk + 2;
	}
	return 0;
}

/* The plan being cut: the segment open for more pieces, the counts so far. */
struct sl_cut {
	struct sl__job *job;
	struct sl__seg *cur;
	size_t ns, np, chunk;
	size_t gap;                 /* reads this close continue a segment: the gap is read and dropped (sl_gap_for) */
	uint64_t wend;              /* the end of the furthest range */
};

/*
 * The read gap for f's ranges: the setting where its reads go to the
 * storage, none where they go through the page cache (the file mostly
 * cached there, O_DIRECT refused, or SLUICE_DIRECT=never): there a gap read
 * through is a copy of bytes nobody asked for, not an I/O saved.  Asked of
 * the file's store as a read of the whole file; stores without a route
 * (object stores) keep the setting.
 */
static size_t sl_gap_for(const struct sluice_engine *eng, struct sluice_file *f)
{
	const struct sl__sfile *sf = &f->s;
	uint64_t size = atomic_load(&sf->size);
	struct sl__route_ask a = { .op = SL_IO_READ, .len = (size_t)size, .cfg = &eng->cfg, .local = eng->local };
	struct sl__route r = { .store = sf->ops, .handle = sf->handle };

	if (!eng->cfg.read_gap || !sf->ops->route || !size)
		return eng->cfg.read_gap;
	sf->ops->route(sf, &a, &r);
	return r.direct || r.gpu ? eng->cfg.read_gap : 0;
}

/*
 * Cuts one range into pieces, each joining the open segment where it
 * continues it (reads: within the read gap, and inside one chunk) unless
 * alone (GPU memory a store moves straight there: one piece a segment).
 */
static void sl_cut_range(struct sl_cut *c, const struct sl_ranged *rd, char *alloc, int alone)
{
	struct sl__job *job = c->job;
	uint64_t off = rd->r.offset;
	size_t left = rd->r.len;
	char *mem = rd->r.buf;
	/*
	 * A gap is read through only when it is no longer than the range it
	 * joins (or a block): at most half of such an I/O is bytes nobody
	 * asked for.  Tensor-parallel column slices (2-7 KiB of each 16-56 KiB
	 * row) stay a read a row: read through, a rank read its whole tensor.
	 */
	const size_t cap = left > SL_ALIGN ? left : SL_ALIGN, gap = c->gap < cap ? c->gap : cap;

	while (left) {
		struct sl__seg *cur = c->cur;
		uint64_t cur_end = cur ? cur->off + cur->len : 0;
		int join = cur && cur->file == rd->r.file && !alone &&
			   (job->op == SL_IO_READ ? off <= cur_end + gap && off >= cur->off : off == cur_end) &&
			   off < cur->off + c->chunk;
		struct sl__piece *p = &job->pieces[c->np++];
		size_t take;

		if (!join) {
			cur = c->cur = &job->segs[c->ns++];
			*cur = (struct sl__seg){ .file = rd->r.file, .off = off, .piece0 = (uint32_t)(p - job->pieces) };
		}
		take = (size_t)(cur->off + c->chunk - off) < left ? (size_t)(cur->off + c->chunk - off) : left;
		*p = (struct sl__piece){ .seg_off = (size_t)(off - cur->off), .len = take, .mem = mem, .gpu = !!alloc,
					 .alloc = alloc, .range = rd->orig };
		cur->npieces++;
		if (off + take > cur->off + cur->len)
			cur->len = (size_t)(off + take - cur->off);
		/*
		 * Only the write that reaches the job's end, at or past the end
		 * of the file, may pad its last block: the padding then lands
		 * where no data was and is truncated away afterwards.
		 */
		cur->pad_ok = job->op == SL_IO_WRITE && cur->off + cur->len == c->wend &&
			      c->wend >= atomic_load(&cur->file->s.size);
		off += take;
		mem += take;
		left -= take;
	}
}

/*
 * The bytes of a segment.  A read of local files smaller than one I/O a
 * worker is cut finer, so that every worker of the lane takes a share: one
 * worker copies out of the page cache at 4-8 GB/s (the H100 machine),
 * where all of them move 50, and a 1 MiB read went at one worker's rate.
 * Not below SL_SHARE_MIN, where a segment's own costs would outweigh its
 * copy; objects keep whole I/Os (a GET costs a request whatever its size).
 */
#define SL_SHARE_MIN ((size_t)128 << 10)

static size_t sl_chunk_for(const struct sluice_engine *eng, const struct sluice_range *in, size_t n, int op)
{
	size_t mts = eng->cfg.max_transfer_size, total = 0, chunk;
	unsigned workers = eng->nworkers / (eng->nlanes ? eng->nlanes : 1);

	if (op != SL_IO_READ || workers < 2)
		return mts;
	for (size_t i = 0; i < n; i++) {
		if (!in[i].file || !in[i].file->s.ops->route)
			return mts;
		total += in[i].len;
		if (total >= (size_t)workers * mts || total < in[i].len)
			return mts;
	}
	chunk = (size_t)sl__align_up((total + workers - 1) / workers, SL_ALIGN);
	return chunk < SL_SHARE_MIN ? (SL_SHARE_MIN < mts ? SL_SHARE_MIN : mts) : chunk;
}

/*
 * Does the call go by DMA from the page cache (worker.c, sl_map_dma)?  A
 * read of map_dma_min to map_dma_max bytes in all, every range into GPU
 * memory from cached bytes its store can map.  Its segments are then not
 * shared among the workers: registrations of pages from several threads
 * wait for each other in the driver (1 MiB in 8 shares: 0.54 GB/s, against
 * 7.7 whole).
 */
static int sl_map_dma_for(const struct sluice_engine *eng, const struct sluice_range *in, size_t n, int op, int crc)
{
	size_t total = 0;

	if (op != SL_IO_READ || crc || !eng->map_dma_max || atomic_load(&eng->map_dma_off) ||
	    eng->cfg.staging == SLUICE_STAGING_PAGEABLE)
		return 0;
	for (size_t i = 0; i < n && total <= eng->map_dma_max; i++)
		total = in[i].len > eng->map_dma_max - total ? SIZE_MAX : total + in[i].len;
	if (total < eng->map_dma_min || total > eng->map_dma_max)
		return 0;
	for (size_t i = 0; i < n; i++) {
		const struct sl__sfile *sf = in[i].file ? &in[i].file->s : NULL;
		struct sl__route_ask a = { .op = SL_IO_READ, .off = in[i].offset, .len = in[i].len, .gpu_whole = 1,
					   .want_map = 1, .cfg = &eng->cfg, .local = eng->local };
		struct sl__route r = { 0 };

		if (!sf || !sf->ops->route || !sl__gpu_is_device_ptr(&eng->gpu, in[i].buf))
			return 0;
		sf->ops->route(sf, &a, &r);
		if (!r.map)
			return 0;
	}
	return 1;
}

int sl__plan(struct sluice_engine *eng, struct sl__job *job, int op,
	     const struct sluice_range *in, size_t n, int crc)
{
	int map_dma = sl_map_dma_for(eng, in, n, op, crc);
	struct sl_cut c = { .job = job, .chunk = map_dma ? eng->cfg.max_transfer_size : sl_chunk_for(eng, in, n, op) };
	struct sl_ranged *rd;
	size_t maxsegs = 0;
	int rc;

	memset(job, 0, sizeof(*job));
	job->op = op;
	job->crc = crc;
	job->lane = -1;
	if (!n)
		return 0;
	job->map_dma = map_dma;
	if (n > UINT32_MAX)
		return sl__err(-E2BIG, "%zu ranges in one call; at most %u", n, UINT32_MAX);
	if (!(rd = malloc(n * sizeof(*rd))))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		rd[i] = (struct sl_ranged){ in[i], (uint32_t)i };
	if (!(rc = sl_plan_check(rd, n, op, c.chunk, &maxsegs))) {
		if (n > 1)
			qsort(rd, n, sizeof(*rd), sl_range_cmp);
		job->segs = malloc(maxsegs * sizeof(*job->segs));
		job->pieces = malloc(maxsegs * sizeof(*job->pieces));
		rc = job->segs && job->pieces ? 0 : -ENOMEM;
	}
	for (size_t i = 0; !rc && i < n; i++)
		if (rd[i].r.offset + rd[i].r.len > c.wend)
			c.wend = rd[i].r.offset + rd[i].r.len;
	for (size_t i = 0; !rc && i < n; i++) {
		int gpu = rd[i].r.len ? sl__gpu_is_device_ptr(&eng->gpu, rd[i].r.buf) : 0;

		/* A file's gap matters only where a range of it follows (ranges are sorted by file). */
		if (op == SL_IO_READ && (i == 0 || rd[i].r.file != rd[i - 1].r.file))
			c.gap = i + 1 < n && rd[i + 1].r.file == rd[i].r.file ? sl_gap_for(eng, rd[i].r.file) : 0;

		if (gpu && job->lane < 0)
			job->lane = sl_lane_of(eng, rd[i].r.buf);
		sl_cut_range(&c, &rd[i], gpu ? sl__gpu_alloc_start(&eng->gpu, rd[i].r.buf) : NULL,
			     gpu && !crc && (rd[i].r.file->s.ops->caps & SL_STORE_GPU_MEM));
	}
	job->nsegs = c.ns;
	job->npieces = c.np;
	free(rd);
	if (rc)
		sl__plan_free(job);
	return rc;
}

void sl__plan_free(struct sl__job *job)
{
	free(job->segs);
	free(job->pieces);
	job->segs = NULL;
	job->pieces = NULL;
}

/*
 * After a write job: a direct write that reached past the end of the file
 * may have padded its last block (sl__plan allows that only past the size
 * it saw), so cut the file back to the real end and remember the size.
 */
int sl__fix_size(const struct sluice_range *r, size_t n)
{
	/* First every file's new size (the furthest end written), then the padding trimmed. */
	for (size_t i = 0; i < n; i++) {
		struct sluice_file *f = r[i].file;
		uint64_t end = r[i].offset + r[i].len, cur = atomic_load(&f->s.size);

		while (end > cur && !atomic_compare_exchange_weak(&f->s.size, &cur, end))
			;
	}
	for (size_t i = 0; i < n; i++) {
		struct sluice_file *f = r[i].file;
		uint64_t want = atomic_load(&f->s.size), size;
		int rc;

		if (i && f == r[i - 1].file)
			continue;
		if ((rc = f->s.ops->stat(&f->s, &size)))
			return sl__err(rc, "%s: fstat: %s", f->path, strerror(-rc));
		if (size > want && size <= sl__align_up(want, SL_ALIGN) && (rc = f->s.ops->truncate(&f->s, f->path, want)))
			return rc;
	}
	return 0;
}
