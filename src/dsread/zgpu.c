/*
 * zstd blocks decoded on the GPU by nvCOMP's batched decoder (dsread.h):
 * the one call whole shards (shard.c) and a GPU loader's windows
 * (dsread.c) share.  A struct sl__zgpu keeps its stream and buffers from
 * call to call, so a loader's reader decodes window after window without
 * allocating (cuMemFree waits for the whole device, the model included).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dsread/dsread.h"

int sl__zgpu_open(struct sl__zgpu **out, const struct sl__gpu *g, const struct sl__nvcomp_api *nc)
{
	struct sl__zgpu *z = calloc(1, sizeof(*z));
	int rc;

	*out = NULL;
	if (!z)
		return -ENOMEM;
	z->g = g, z->nc = nc;
	z->args_dev.dev = z->temp.dev = z->in_dev.dev = z->out_dev.dev = 1;
	if ((rc = nc->ZstdGetRequiredAlignments(z->opts, &z->al)))
		rc = sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressGetRequiredAlignments: status %d", rc);
	else if (z->al.input > SL_ZGPU_ALIGN || z->al.output > SL_ZGPU_ALIGN || z->al.temp > SL_ZGPU_ALIGN)
		rc = sl__err(SLUICE_ECUDA, "nvCOMP wants alignments of %zu/%zu/%zu bytes, more than %d", z->al.input,
			     z->al.output, z->al.temp, SL_ZGPU_ALIGN);
	if (!rc && !(rc = sl__gpu_bind(g)))
		rc = SL_CU(g->cu->StreamCreate(&z->st, SL_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	if (rc) {
		sl__zgpu_close(z);
		return rc;
	}
	*out = z;
	return 0;
}

void sl__zgpu_close(struct sl__zgpu *z)
{
	if (!z)
		return;
	struct sl__gbuf *b[] = { &z->args, &z->args_dev, &z->temp, &z->in, &z->in_dev, &z->out_dev, &z->out };

	if (z->st && !sl__gpu_bind(z->g)) {
		z->g->cu->StreamSynchronize(z->st);
		z->g->cu->StreamDestroy(z->st);
	}
	for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
		sl__gbuf_free(z->g, b[i]);
	free(z);
}

int sl__zgpu_run(struct sl__zgpu *z, const struct sl__zgpu_item *it, uint64_t n, uint64_t *bad)
{
	const struct sl__cuda_api *cu = z->g->cu;
	size_t arr = n * (5 * sizeof(uint64_t) + sizeof(int)), temp = 0, max = 0, total = 0;
	uint64_t *h, A;
	int rc;

	*bad = UINT64_MAX;
	if (!n)
		return 0;
	for (uint64_t k = 0; k < n; k++) {
		max = it[k].len > max ? it[k].len : max;
		total += it[k].len;
	}
	if ((rc = sl__gpu_bind(z->g)) || (rc = sl__gbuf_room(z->g, &z->args, arr, 0, "nvCOMP")) ||
	    (rc = sl__gbuf_room(z->g, &z->args_dev, arr, 1, "nvCOMP")))
		return rc;
	if ((rc = z->nc->ZstdGetTempSize(n, max, z->opts, &temp, total, z->st)))
		return sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressGetTempSize: status %d", rc);
	if ((rc = sl__gbuf_room(z->g, &z->temp, temp + 1, 1, "nvCOMP")))
		return rc;
	/* h: in pointers, in sizes, out capacities, out sizes (filled by nvCOMP), out pointers, statuses. */
	h = z->args.p;
	A = (uint64_t)(uintptr_t)z->args_dev.p;
	for (uint64_t k = 0; k < n; k++) {
		h[k] = it[k].in;
		h[n + k] = it[k].stored;
		h[2 * n + k] = it[k].len;
		h[3 * n + k] = UINT64_MAX;
		h[4 * n + k] = it[k].out;
		((int *)(h + 5 * n))[k] = -1;
	}
	if ((rc = SL_CU(cu->MemcpyHtoDAsync(A, h, arr, z->st), "cuMemcpyHtoDAsync (nvCOMP arguments)")))
		return rc;
	rc = z->nc->ZstdDecompressAsync((const void *const *)(uintptr_t)A, (const size_t *)(uintptr_t)(A + 8 * n),
					(const size_t *)(uintptr_t)(A + 16 * n), (size_t *)(uintptr_t)(A + 24 * n), n,
					z->temp.p, temp, (void *const *)(uintptr_t)(A + 32 * n), z->opts,
					(int *)(uintptr_t)(A + 40 * n), z->st);
	if (rc)
		return sl__err(SLUICE_ECUDA, "nvcompBatchedZstdDecompressAsync: status %d", rc);
	if ((rc = SL_CU(cu->MemcpyDtoHAsync(h, A, arr, z->st), "cuMemcpyDtoHAsync (nvCOMP results)")) ||
	    (rc = SL_CU(cu->StreamSynchronize(z->st), "cuStreamSynchronize (nvCOMP)")))
		return rc;
	for (uint64_t k = 0; k < n; k++) {
		int status = ((const int *)(h + 5 * n))[k];

		if (status || h[3 * n + k] != it[k].len) {
			*bad = k;
			return sl__err(SLUICE_EFORMAT, "nvCOMP status %d, %llu bytes decoded of %u", status,
				       (unsigned long long)h[3 * n + k], it[k].len);
		}
	}
	return 0;
}
