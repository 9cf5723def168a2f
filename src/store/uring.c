/*
 * io_uring store (liburing).  One ring per worker thread.
 *
 * The worker's bounce slots are registered as fixed buffers, so O_DIRECT
 * reads into them skip the per-I/O page pinning; files go into a sparse
 * fixed-file table at their index in the engine's file table, filled
 * lazily on first use by this ring.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>

#include <liburing.h>

#include "store/store.h"

/* Files an engine can register with each ring: two descriptors per file index. */
#define SL_URING_FILES 2048

struct sl_uring {
	struct io_uring ring;
	int fixed_bufs;   /* slots registered as fixed buffers */
	int fixed_files;  /* sparse file table registered */
	char *buf_lo;     /* registered area [buf_lo, buf_hi) */
	char *buf_hi;
	size_t buf_size;
	unsigned queued;  /* prepared, not yet submitted */
	struct {
		int fd;
		unsigned gen;
	} files[SL_URING_FILES];
};

/* The fixed-buffer warning is said once per process, not once per ring. */
static _Atomic int sl_uring_warned;

struct sl_try {
	unsigned flags, entries, count;
	int rc;
};

/* count rings of entries each, all at once (as the workers hold them), then torn down. */
static void *sl_try_ring(void *arg)
{
	struct sl_try *t = arg;
	struct io_uring ring[256];
	unsigned made = 0;

	t->rc = 0;
	while (made < t->count && made < 256 && !(t->rc = io_uring_queue_init(t->entries, &ring[made], t->flags)))
		made++;
	while (made)
		io_uring_queue_exit(&ring[--made]);
	return NULL;
}

/*
 * The rings made and torn down on a thread of its own: a ring's teardown
 * leaves the kernel work for the task that made it, which interrupts that
 * task's next blocking syscall (a pipe write of the caller's then returns
 * short, and Python's sys.stdout.buffer.write reports fewer bytes).  As
 * many rings as the workers will hold: kernels that charge rings to the
 * memlock limit refuse the later ones, not the first.
 */
int sl__uring_try(unsigned flags, unsigned entries, unsigned count)
{
	struct sl_try t = { flags, entries, count ? count : 1, -EAGAIN };
	pthread_t th;

	if (pthread_create(&th, NULL, sl_try_ring, &t))
		return -EAGAIN;
	pthread_join(th, NULL);
	return t.rc;
}

static int sl_uring_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	int rc = sl__uring_try(cfg->sqpoll ? IORING_SETUP_SQPOLL : 0, cfg->queue_depth < 8 ? 8 : cfg->queue_depth * 2,
			       cfg->threads);

	if (rc < 0) {
		char dis[16] = "?";
		FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "r");

		if (f) {
			if (!fgets(dis, sizeof(dis), f))
				strcpy(dis, "?");
			dis[strcspn(dis, "\n")] = '\0';
			fclose(f);
		}
		if (rc == -ENOMEM) {
			/* The rings' memory is charged to RLIMIT_MEMLOCK (before Linux 5.12, and under some policies). */
			struct rlimit rl = { 0, 0 };

			getrlimit(RLIMIT_MEMLOCK, &rl);
			snprintf(why, n, "io_uring unusable: io_uring_setup failed: %s: its rings count against the memlock "
				 "limit, now %llu bytes (raise it: ulimit -l unlimited; systemd LimitMEMLOCK=infinity; "
				 "docker --ulimit memlock=-1)%s", strerror(-rc), (unsigned long long)rl.rlim_cur,
				 cfg->sqpoll ? " [SQPOLL requested]" : "");
			return rc;
		}
		snprintf(why, n, "io_uring unusable: io_uring_setup failed: %s (kernel.io_uring_disabled=%s; "
			 "a seccomp filter or container policy may block it)%s",
			 strerror(-rc), dis, cfg->sqpoll ? " [SQPOLL requested]" : "");
		return rc;
	}
	return 0;
}

static int sl_uring_init(struct sl__io_ctx *ctx, const struct sluice_config *cfg, unsigned depth)
{
	struct sl_uring *u = calloc(1, sizeof(*u));
	struct io_uring_params p;
	int rc;

	if (!u)
		return -ENOMEM;
	memset(&p, 0, sizeof(p));
	if (cfg->sqpoll) {
		p.flags |= IORING_SETUP_SQPOLL;
		p.sq_thread_idle = 50;
	}
	rc = io_uring_queue_init_params(depth < 8 ? 8 : depth * 2, &u->ring, &p);
	if (rc < 0) {
		free(u);
		return sl__err(rc, "io_uring_queue_init_params: %s", strerror(-rc));
	}
	for (unsigned i = 0; i < SL_URING_FILES; i++)
		u->files[i].fd = -1;
	u->fixed_files = io_uring_register_files_sparse(&u->ring, SL_URING_FILES) == 0;

	ctx->priv = u;
	return 0;
}

static void sl_uring_register_bufs(struct sl__io_ctx *ctx, void *const *bufs, unsigned nbufs, size_t buf_size)
{
	struct sl_uring *u = ctx->priv;
	struct iovec *iov = calloc(nbufs, sizeof(*iov));
	int rc;

	if (!iov || !nbufs) {
		free(iov);
		return;
	}
	for (unsigned i = 0; i < nbufs; i++) {
		iov[i].iov_base = bufs[i];
		iov[i].iov_len = buf_size;
	}
	/*
	 * Registration pins the pages and is charged to RLIMIT_MEMLOCK
	 * for users without CAP_IPC_LOCK; when refused, I/O still works
	 * with plain buffers, pinned per request by the kernel.
	 */
	rc = io_uring_register_buffers(&u->ring, iov, nbufs);
	free(iov);
	if (rc == 0) {
		u->buf_size = buf_size;
		u->buf_lo = bufs[0];
		u->buf_hi = (char *)bufs[nbufs - 1] + buf_size;
		u->fixed_bufs = 1;
		ctx->fixed = 1;
	} else if (!atomic_exchange(&sl_uring_warned, 1)) {
		struct rlimit rl;

		getrlimit(RLIMIT_MEMLOCK, &rl);
		sl__warn("io", "io_uring fixed buffers off: registering %u x %zu bytes failed (%s); "
			 "RLIMIT_MEMLOCK is %llu bytes (raise it with `ulimit -l`)",
			 nbufs, buf_size, strerror(-rc), (unsigned long long)rl.rlim_cur);
	}
}


/* Returns the fixed-file index for io, registering its fd on first use. */
static int sl_uring_file(struct sl_uring *u, const struct sl__io *io)
{
	int i = 2 * io->file_index + io->direct, fd = sl__local_fd(io);

	if (!u->fixed_files || io->file_index < 0 || i >= SL_URING_FILES)
		return -1;
	if (u->files[i].fd != fd || u->files[i].gen != io->file_gen) {

		if (io_uring_register_files_update(&u->ring, (unsigned)i, &fd, 1) != 1)
			return -1;
		u->files[i].fd = fd;
		u->files[i].gen = io->file_gen;
	}
	return i;
}

static int sl_uring_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	struct sl_uring *u = ctx->priv;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	int fi = sl_uring_file(u, io), fd = fi >= 0 ? fi : sl__local_fd(io);
	int fixed = u->fixed_bufs && io->buf_index >= 0;

	if (!sqe) {
		io_uring_submit(&u->ring);
		u->queued = 0;
		sqe = io_uring_get_sqe(&u->ring);
		if (!sqe)
			return -EBUSY;
	}
	if (io->op == SL_IO_READ) {
		if (fixed)
			io_uring_prep_read_fixed(sqe, fd, io->buf, (unsigned)io->len, io->offset, io->buf_index);
		else
			io_uring_prep_read(sqe, fd, io->buf, (unsigned)io->len, io->offset);
	} else {
		if (fixed)
			io_uring_prep_write_fixed(sqe, fd, io->buf, (unsigned)io->len, io->offset, io->buf_index);
		else
			io_uring_prep_write(sqe, fd, io->buf, (unsigned)io->len, io->offset);
	}
	if (fi >= 0)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data(sqe, io);
	u->queued++;
	return 0;
}

static int sl_uring_reap(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max, int wait)
{
	struct sl_uring *u = ctx->priv;
	struct io_uring_cqe *cqes[64];
	unsigned n, k = 0;
	int rc;

	if (u->queued || wait) {
		rc = io_uring_submit_and_wait(&u->ring, wait ? 1 : 0);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
			return sl__err(rc, "io_uring_submit_and_wait: %s", strerror(-rc));
		if (rc >= 0)
			u->queued = 0;
	}
	if (max > 64)
		max = 64;
	n = io_uring_peek_batch_cqe(&u->ring, cqes, max);
	for (; k < n; k++) {
		struct sl__io *io = io_uring_cqe_get_data(cqes[k]);

		io->res = cqes[k]->res;
		done[k] = io;
	}
	io_uring_cq_advance(&u->ring, n);
	return (int)k;
}

static void sl_uring_fini(struct sl__io_ctx *ctx)
{
	struct sl_uring *u = ctx->priv;

	if (!u)
		return;
	io_uring_queue_exit(&u->ring);
	free(u);
	ctx->priv = NULL;
}

const struct sl__store sl__store_uring = {
	.name = "uring",
	.id = SL_STORE_ID_uring,
	.caps = SL_STORE_ASYNC | SL_STORE_FIXED | SL_STORE_LOCAL,
	.probe = sl_uring_probe,
	SL_LOCAL_FILE_OPS,
	.init = sl_uring_init,
	.register_bufs = sl_uring_register_bufs,
	.submit = sl_uring_submit,
	.reap = sl_uring_reap,
	.fini = sl_uring_fini,
};
