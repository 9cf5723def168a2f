/*
 * psync store: pread/pwrite on the worker thread.  Every I/O completes
 * inside submit; reap hands the finished ones back in order.  Parallelism
 * comes from the number of workers.  The completion queue (sl__sync_*) also
 * serves the other synchronous stores (gds, s3, http).
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "store/store.h"

struct sl_psync {
	unsigned head, n, cap;
	struct sl__io *done[];
};

ssize_t sl__pio_full(int op, int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t r = op == SL_IO_READ ? pread(fd, (char *)buf + got, len - got, (off_t)(off + got))
					     : pwrite(fd, (const char *)buf + got, len - got, (off_t)(off + got));

		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (r == 0) {
			if (op == SL_IO_READ)
				break; /* EOF */
			return -EIO;
		}
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static int sl_psync_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	(void)cfg, (void)why, (void)n;
	return 0;
}

int sl__sync_init(struct sl__io_ctx *ctx, const struct sluice_config *cfg, unsigned depth)
{
	struct sl_psync *p;

	(void)cfg;
	p = calloc(1, sizeof(*p) + (depth + 1) * sizeof(p->done[0]));
	if (!p)
		return -ENOMEM;
	p->cap = depth + 1;
	ctx->priv = p;
	return 0;
}

static int sl_psync_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	io->res = sl__pio_full(io->op, sl__local_fd(io), io->buf, io->len, io->offset);
	return sl__sync_complete(ctx, io);
}

int sl__sync_complete(struct sl__io_ctx *ctx, struct sl__io *io)
{
	struct sl_psync *p = ctx->priv;

	if (p->n == p->cap)
		return -EBUSY;
	p->done[(p->head + p->n++) % p->cap] = io;
	return 0;
}

int sl__sync_reap(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max, int wait)
{
	struct sl_psync *p = ctx->priv;
	unsigned k = 0;

	(void)wait;
	while (k < max && p->n) {
		done[k++] = p->done[p->head];
		p->head = (p->head + 1) % p->cap;
		p->n--;
	}
	return (int)k;
}

void sl__sync_fini(struct sl__io_ctx *ctx)
{
	free(ctx->priv);
	ctx->priv = NULL;
}

const struct sl__store sl__store_psync = {
	.name = "psync",
	.id = SL_STORE_ID_psync,
	.caps = SL_STORE_LOCAL,
	.probe = sl_psync_probe,
	SL_LOCAL_FILE_OPS,
	.init = sl__sync_init,
	.submit = sl_psync_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
};
