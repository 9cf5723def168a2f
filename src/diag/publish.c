/*
 * Loaders' published figures (diag.h): one shared-memory file per open
 * loader, so `sluice top` in another process sees every running loader on
 * the machine, and a registry of this process's loaders for /metrics.
 *
 * The file holds one struct sl_page.  The loader's thread rewrites it under
 * a sequence count (odd while writing); a reader in another process copies
 * it and keeps the copy only if the count was even and unchanged across the
 * copy.  Readers in this process (the metrics) take the pub's mutex instead.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "diag/diag.h"

#define SL_PUB_MAGIC 0x42504c53u /* "SLPB" */

struct sl_page {
	uint32_t magic;
	uint32_t size;          /* sizeof(struct sluice_loader_figures): writer's and reader's layouts agree */
	_Atomic uint64_t seq;   /* odd while the figures are written */
	uint64_t updated_ns;    /* CLOCK_REALTIME */
	struct sluice_loader_figures f;
};

struct sl__pub {
	struct sl_page *page;   /* the mapped file, or heap memory when none could be made */
	int mapped;
	char path[512];
	pthread_mutex_t mu;     /* this process's readers against the writer */
	struct sl__pub *next;   /* the registry */
};

static pthread_mutex_t sl_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sl__pub *sl_reg;
static _Atomic unsigned sl_next_id = 1;

static const char *sl_run_dir(void)
{
	const char *d = sl__setting("SLUICE_RUN_DIR");

	if (d && *d)
		return d;
	/* Memory-backed where there is one; a container without /dev/shm gets the temporary directory. */
	if (!access("/dev/shm", W_OK | X_OK))
		return "/dev/shm";
	d = getenv("TMPDIR");
	return d && *d ? d : "/tmp";
}

static uint64_t sl_wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct sl__pub *sl__pub_open(const char *dataset)
{
	struct sl__pub *p = calloc(1, sizeof(*p));
	unsigned id = atomic_fetch_add(&sl_next_id, 1);
	int fd;

	if (!p)
		return NULL;
	snprintf(p->path, sizeof(p->path), "%s/sluice-loader.%d.%u", sl_run_dir(), (int)getpid(), id);
	fd = open(p->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd >= 0 && ftruncate(fd, sizeof(struct sl_page)) == 0) {
		void *m = mmap(NULL, sizeof(struct sl_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		if (m != MAP_FAILED) {
			p->page = m;
			p->mapped = 1;
		}
	}
	if (fd >= 0)
		close(fd);
	if (!p->mapped) {
		if (fd >= 0)
			unlink(p->path);
		sl__debug("diag", "%s: not published for sluice top", p->path);
		p->path[0] = 0;
		p->page = calloc(1, sizeof(struct sl_page));
		if (!p->page) {
			free(p);
			return NULL;
		}
	}
	p->page->size = sizeof(struct sluice_loader_figures);
	p->page->f.pid = (int)getpid();
	p->page->f.id = id;
	snprintf(p->page->f.dataset, sizeof(p->page->f.dataset), "%s", dataset ? dataset : "");
	snprintf(p->page->f.verdict, sizeof(p->page->f.verdict), "no batches yet");
	p->page->updated_ns = sl_wall_ns();
	atomic_thread_fence(memory_order_release);
	p->page->magic = SL_PUB_MAGIC; /* last: a reader takes the page only once it is whole */
	pthread_mutex_init(&p->mu, NULL);
	pthread_mutex_lock(&sl_reg_mu);
	p->next = sl_reg;
	sl_reg = p;
	pthread_mutex_unlock(&sl_reg_mu);
	return p;
}

void sl__pub_update(struct sl__pub *p, const struct sluice_loader_figures *f)
{
	uint64_t s;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	s = atomic_load_explicit(&p->page->seq, memory_order_relaxed);
	atomic_store_explicit(&p->page->seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	/* Who it is stays as opened. */
	{
		int pid = p->page->f.pid;
		unsigned id = p->page->f.id;
		char ds[sizeof(f->dataset)];

		memcpy(ds, p->page->f.dataset, sizeof(ds));
		p->page->f = *f;
		p->page->f.pid = pid;
		p->page->f.id = id;
		memcpy(p->page->f.dataset, ds, sizeof(ds));
	}
	p->page->updated_ns = sl_wall_ns();
	atomic_store_explicit(&p->page->seq, s + 2, memory_order_release);
	pthread_mutex_unlock(&p->mu);
}

void sl__pub_close(struct sl__pub *p)
{
	struct sl__pub **pp;

	if (!p)
		return;
	pthread_mutex_lock(&sl_reg_mu);
	for (pp = &sl_reg; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	pthread_mutex_unlock(&sl_reg_mu);
	if (p->mapped) {
		munmap(p->page, sizeof(struct sl_page));
		unlink(p->path);
	} else {
		free(p->page);
	}
	pthread_mutex_destroy(&p->mu);
	free(p);
}

int sl__pub_each(int (*fn)(const struct sluice_loader_figures *f, void *arg), void *arg)
{
	int rc = 0;

	pthread_mutex_lock(&sl_reg_mu);
	for (struct sl__pub *p = sl_reg; p && !rc; p = p->next) {
		struct sluice_loader_figures f;

		pthread_mutex_lock(&p->mu);
		f = p->page->f;
		f.age_s = (double)(sl_wall_ns() - p->page->updated_ns) / 1e9;
		pthread_mutex_unlock(&p->mu);
		rc = fn(&f, arg);
	}
	pthread_mutex_unlock(&sl_reg_mu);
	return rc;
}

/* Copies a page written by another process; 0, or -EAGAIN if it stayed mid-write. */
static int sl_read_page(const struct sl_page *pg, struct sluice_loader_figures *f)
{
	for (int tries = 0; tries < 1000; tries++) {
		uint64_t s1 = atomic_load_explicit(&((struct sl_page *)pg)->seq, memory_order_acquire), s2;
		uint64_t upd;

		if (s1 & 1) {
			sched_yield();
			continue;
		}
		memcpy(f, &pg->f, sizeof(*f));
		upd = pg->updated_ns;
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit(&((struct sl_page *)pg)->seq, memory_order_relaxed);
		if (s1 == s2) {
			uint64_t now = sl_wall_ns();

			f->age_s = now > upd ? (double)(now - upd) / 1e9 : 0;
			f->dataset[sizeof(f->dataset) - 1] = 0;
			f->verdict[sizeof(f->verdict) - 1] = 0;
			return 0;
		}
	}
	return -EAGAIN;
}

static int sl_fig_cmp(const void *a, const void *b)
{
	const struct sluice_loader_figures *x = a, *y = b;

	return x->pid != y->pid ? (x->pid > y->pid) - (x->pid < y->pid) : (x->id > y->id) - (x->id < y->id);
}

int sluice_loaders_published(struct sluice_loader_figures *out, unsigned cap)
{
	const char *dir = sl_run_dir();
	struct dirent *e;
	unsigned n = 0;
	DIR *d = opendir(dir);

	if (!d)
		return sl__err(-errno, "SLUICE_RUN_DIR %s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		char path[PATH_MAX];
		struct sluice_loader_figures f;
		struct stat st;
		int pid, fd;
		unsigned id;
		void *m;

		if (sscanf(e->d_name, "sluice-loader.%d.%u", &pid, &id) != 2 || pid <= 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (kill(pid, 0) < 0 && errno == ESRCH) {
			unlink(path); /* a loader whose process died without closing it */
			continue;
		}
		fd = sl__open_file(path, O_RDONLY, 0); /* anyone can put a FIFO in a shared run directory */
		if (fd < 0)
			continue;
		if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct sl_page)) {
			close(fd);
			continue;
		}
		m = mmap(NULL, sizeof(struct sl_page), PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (m == MAP_FAILED)
			continue;
		if (((struct sl_page *)m)->magic == SL_PUB_MAGIC &&
		    ((struct sl_page *)m)->size == sizeof(struct sluice_loader_figures) && !sl_read_page(m, &f)) {
			if (n < cap)
				out[n] = f;
			n++;
		}
		munmap(m, sizeof(struct sl_page));
	}
	closedir(d);
	if (out && n)
		qsort(out, n < cap ? n : cap, sizeof(*out), sl_fig_cmp);
	return (int)n;
}
