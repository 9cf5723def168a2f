/*
 * sluice_machine_sample (sluice.h): the machine's counters read from
 * /proc under SLUICE_SYSROOT, in one place for `sluice top` and for
 * sluice.profile's sampler: CPU time (all CPUs and each), memory and the
 * page cache, whole disks, network interfaces, and a process tree (a
 * training script and its DataLoader workers).  Kernel text, parsed
 * defensively all the same: a line that does not parse is skipped, a
 * count past its array's room is left out (and said, for processes).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

#define SL_SLURP_MAX (4u << 20)

/* A /proc file (path under the sysroot) whole into a malloc'd, NUL-ended buffer; NULL if unreadable. */
static char *sl_slurp(const char *rel)
{
	char p[4096];
	size_t n = 0, cap = 16384;
	char *buf = malloc(cap);
	int fd;

	snprintf(p, sizeof(p), "%s%s", sl__sysroot(), rel);
	/* O_NONBLOCK: a FIFO (under a faked root) reads as empty instead of holding the sample. */
	if (!buf || (fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0) {
		free(buf);
		return NULL;
	}
	for (;;) {
		ssize_t got;

		if (n + 1 == cap) {
			char *b = cap >= SL_SLURP_MAX ? NULL : realloc(buf, cap * 2);

			if (!b)
				break; /* what fits is parsed */
			buf = b;
			cap *= 2;
		}
		got = read(fd, buf + n, cap - 1 - n);
		if (got < 0 && errno == EINTR)
			continue; /* EAGAIN (a FIFO with a writer) ends it like EOF */
		if (got <= 0)
			break;
		n += (size_t)got;
	}
	close(fd);
	buf[n] = 0;
	return buf;
}

/* The next line of *at (consumed), NUL-ended in place; NULL at the end. */
static char *sl_line(char **at)
{
	char *l = *at, *e;

	if (!l || !*l)
		return NULL;
	e = strchr(l, '\n');
	if (e) {
		*e = 0;
		*at = e + 1;
	} else {
		*at = l + strlen(l);
	}
	return l;
}

/* /proc/stat's cpu lines: all CPUs ("cpu ") and each ("cpuN"). */
static void sl_cpu(struct sluice_machine_sample *s, double tck)
{
	char *text = sl_slurp("/proc/stat"), *at = text, *l;

	while ((l = sl_line(&at))) {
		unsigned long long v[8] = { 0 };
		struct sluice_cpu_times *c;
		char name[16];

		if (strncmp(l, "cpu", 3) ||
		    sscanf(l, "%15s %llu %llu %llu %llu %llu %llu %llu %llu", name, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
			   &v[6], &v[7]) < 5)
			continue;
		if (!strcmp(name, "cpu")) {
			c = &s->all;
		} else if (s->ncpus < SLUICE_SAMPLE_CPUS && isdigit((unsigned char)name[3])) {
			c = &s->cpu[s->ncpus++];
		} else {
			continue;
		}
		/* user nice system idle iowait irq softirq steal */
		c->busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tck;
		c->idle_s = (double)v[3] / tck;
		c->iowait_s = (double)v[4] / tck;
	}
	free(text);
}

/* /proc/meminfo's figures (kB) into bytes. */
static void sl_mem(struct sluice_machine_sample *s)
{
	static const struct {
		const char *key;
		size_t off;
	} keys[] = {
		{ "MemTotal:", offsetof(struct sluice_machine_sample, mem_total) },
		{ "MemAvailable:", offsetof(struct sluice_machine_sample, mem_available) },
		{ "Cached:", offsetof(struct sluice_machine_sample, page_cache) },
		{ "Dirty:", offsetof(struct sluice_machine_sample, dirty) },
		{ "Mlocked:", offsetof(struct sluice_machine_sample, mlocked) },
	};
	char *text = sl_slurp("/proc/meminfo"), *at = text, *l;

	while ((l = sl_line(&at)))
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			size_t n = strlen(keys[k].key);
			unsigned long long kb;

			if (!strncmp(l, keys[k].key, n) && sscanf(l + n, "%llu", &kb) == 1 && kb < (UINT64_MAX >> 10))
				*(uint64_t *)(void *)((char *)s + keys[k].off) = (uint64_t)kb << 10;
		}
	free(text);
}

/* Whole disks only (those under /sys/block), loop and ram devices left out. */
static int sl_whole_disk(const char *name)
{
	char p[4096];
	struct stat st;

	if (!strncmp(name, "loop", 4) || !strncmp(name, "ram", 3) || !strncmp(name, "zram", 4) || strchr(name, '/') ||
	    !strcmp(name, ".") || !strcmp(name, ".."))
		return 0;
	snprintf(p, sizeof(p), "%s/sys/block", sl__sysroot());
	if (stat(p, &st))
		return 1; /* no sysfs to tell: all of them */
	snprintf(p, sizeof(p), "%s/sys/block/%s", sl__sysroot(), name);
	return !stat(p, &st);
}

/* /proc/diskstats: major minor name reads merged sectors ms writes merged sectors ms in_flight io_ms ... */
static void sl_disks(struct sluice_machine_sample *s)
{
	char *text = sl_slurp("/proc/diskstats"), *at = text, *l;

	while ((l = sl_line(&at)) && s->ndisks < SLUICE_SAMPLE_DISKS) {
		struct sluice_disk_counters *d = &s->disk[s->ndisks];
		unsigned long long rd, rsec, rms, wr, wsec, io_ms, skip;

		if (sscanf(l, "%*u %*u %31s %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", d->name, &rd, &skip, &rsec,
			   &rms, &wr, &skip, &wsec, &skip, &skip, &io_ms) != 11 ||
		    !sl_whole_disk(d->name))
			continue;
		d->reads = rd;
		d->read_bytes = (uint64_t)rsec * 512;
		d->writes = wr;
		d->write_bytes = (uint64_t)wsec * 512;
		d->read_wait_s = (double)rms / 1e3;
		d->busy_s = (double)io_ms / 1e3;
		s->ndisks++;
	}
	free(text);
}

/* /proc/net/dev: "  name: rx_bytes rx_packets errs drop fifo frame compressed multicast tx_bytes ...", lo left out. */
static void sl_nics(struct sluice_machine_sample *s)
{
	char *text = sl_slurp("/proc/net/dev"), *at = text, *l;

	while ((l = sl_line(&at)) && s->nnics < SLUICE_SAMPLE_NICS) {
		struct sluice_nic_counters *c = &s->nic[s->nnics];
		char *colon = strchr(l, ':'), *name = l;
		unsigned long long rx, tx, skip;

		if (!colon)
			continue;
		*colon = 0;
		while (*name == ' ' || *name == '\t')
			name++;
		if (!*name || !strcmp(name, "lo") || strlen(name) >= sizeof(c->name) ||
		    sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &rx, &skip, &skip, &skip, &skip, &skip,
			   &skip, &skip, &tx) != 9)
			continue;
		strcpy(c->name, name);
		c->rx_bytes = rx;
		c->tx_bytes = tx;
		s->nnics++;
	}
	free(text);
}

/* A process of /proc/N/stat: its parent, command name, CPU seconds and resident pages; 0 or -1. */
static int sl_proc_stat(int pid, struct sluice_proc_counters *p, double tck, long page)
{
	char rel[64], *text, *lp, *rp;
	unsigned long long ut, st;
	long long rss;
	int ppid, rc = -1;

	snprintf(rel, sizeof(rel), "/proc/%d/stat", pid);
	if (!(text = sl_slurp(rel)))
		return -1;
	/* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so it ends at the last ')'. */
	lp = strchr(text, '(');
	rp = strrchr(text, ')');
	if (lp && rp && rp > lp &&
	    sscanf(rp + 1, " %*c %d %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu %*s %*s %*s %*s %*s %*s %*s %*s %lld",
		   &ppid, &ut, &st, &rss) == 4) {
		size_t n = (size_t)(rp - lp - 1);

		memset(p, 0, sizeof(*p));
		p->pid = pid;
		p->ppid = ppid;
		memcpy(p->name, lp + 1, n < sizeof(p->name) - 1 ? n : sizeof(p->name) - 1);
		p->cpu_s = (double)(ut + st) / tck;
		p->rss = rss > 0 && (uint64_t)rss <= UINT64_MAX / (uint64_t)page ? (uint64_t)rss * (uint64_t)page : 0;
		rc = 0;
	}
	free(text);
	return rc;
}

/* /proc/N/io's read_bytes and rchar, where this process may read them. */
static void sl_proc_io(struct sluice_proc_counters *p)
{
	char rel[64], *text, *at, *l;

	snprintf(rel, sizeof(rel), "/proc/%d/io", p->pid);
	at = text = sl_slurp(rel);
	while ((l = sl_line(&at))) {
		unsigned long long v;

		if (sscanf(l, "rchar: %llu", &v) == 1)
			p->rchar = v;
		else if (sscanf(l, "read_bytes: %llu", &v) == 1)
			p->read_bytes = v;
	}
	free(text);
}

/* Every process's pid and parent, from /proc/N/stat. */
struct sl_pp {
	int pid, ppid;
};

static size_t sl_all_procs(struct sl_pp **out, double tck, long page)
{
	char p[4096];
	DIR *d;
	struct dirent *e;
	size_t n = 0, cap = 0;
	struct sl_pp *v = NULL;

	snprintf(p, sizeof(p), "%s/proc", sl__sysroot());
	if (!(d = opendir(p)))
		return 0;
	while ((e = readdir(d))) {
		struct sluice_proc_counters pc;
		int pid;

		if (!isdigit((unsigned char)e->d_name[0]) || (pid = atoi(e->d_name)) <= 0)
			continue;
		/* One parser of /proc/N/stat; a process that ended meanwhile is passed over. */
		if (!sl_proc_stat(pid, &pc, tck, page) && !sl__reserve(&v, &cap, (n + 1) * sizeof(*v)))
			v[n++] = (struct sl_pp){ pid, pc.ppid };
	}
	closedir(d);
	*out = v;
	return n;
}

/*
 * pid's children from /proc/PID/task/TID/children (each thread's: a
 * child is listed under the thread that forked it) into kids (*n of cap);
 * -1 where the kernel keeps no such files (the whole /proc is scanned
 * then).  Reading them costs the tree's size, not the machine's process
 * count.
 */
static int sl_children(int pid, int *kids, size_t *n, size_t cap)
{
	char p[4096];
	DIR *d;
	struct dirent *e;
	int found = 0;

	snprintf(p, sizeof(p), "%s/proc/%d/task", sl__sysroot(), pid);
	if (!(d = opendir(p)))
		return -1;
	while ((e = readdir(d))) {
		char rel[96], *text, *at, *end;

		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		snprintf(rel, sizeof(rel), "/proc/%d/task/%.16s/children", pid, e->d_name);
		if (!(text = sl_slurp(rel)))
			continue;
		found = 1;
		for (at = text;; at = end) {
			long k = strtol(at, &end, 10);

			if (end == at)
				break;
			if (k > 0 && k <= 0x7fffffff && *n < cap)
				kids[(*n)++] = (int)k;
		}
		free(text);
	}
	closedir(d);
	return found ? 0 : -1;
}

/* The tree of root: root first, then its descendants, breadth first. */
static void sl_tree(struct sluice_machine_sample *s, int root, double tck)
{
	struct sl_pp *all = NULL;
	size_t n = 0;
	int scanned = 0;
	long page = sysconf(_SC_PAGESIZE);
	int queue[SLUICE_SAMPLE_PROCS], kids[4096];
	unsigned head = 0, tail = 0;

	queue[tail++] = root;
	while (head < tail) {
		int pid = queue[head++];
		struct sluice_proc_counters *p = &s->proc[s->nprocs];
		size_t nk = 0;

		if (sl_proc_stat(pid, p, tck, page > 0 ? page : 4096))
			continue; /* it ended meanwhile */
		sl_proc_io(p);
		s->nprocs++;
		if (sl_children(pid, kids, &nk, sizeof(kids) / sizeof(kids[0]))) {
			if (!scanned) { /* no children files: every process's parent, once */
				n = sl_all_procs(&all, tck, page > 0 ? page : 4096);
				scanned = 1;
			}
			for (size_t i = 0; i < n && nk < sizeof(kids) / sizeof(kids[0]); i++)
				if (all[i].ppid == pid)
					kids[nk++] = all[i].pid;
		}
		for (size_t i = 0; i < nk; i++) {
			unsigned seen = 0;

			while (seen < tail && queue[seen] != kids[i]) /* a loop of parents is walked once */
				seen++;
			if (seen < tail)
				continue;
			if (tail < SLUICE_SAMPLE_PROCS)
				queue[tail++] = kids[i];
			else
				s->procs_left_out++;
		}
	}
	free(all);
}

int sluice_machine_sample(struct sluice_machine_sample *out, int pid)
{
	struct sluice_machine_sample *s;
	struct timespec ts;
	double tck = (double)sysconf(_SC_CLK_TCK);
	int rc;

	sl__err_clear();
	if (!out)
		return sl__err(-EINVAL, "sluice_machine_sample: no struct to fill");
	if ((rc = SL_REPORT_IN(out, machine_sample)))
		return rc;
	if (!(s = calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->struct_size = sizeof(*s);
	if (tck <= 0)
		tck = 100;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	s->t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	sl_cpu(s, tck);
	sl_mem(s);
	sl_disks(s);
	sl_nics(s);
	if (pid >= 0)
		sl_tree(s, pid ? pid : (int)getpid(), tck);
	rc = s->all.busy_s || s->all.idle_s ? 0 : sl__err(-ENOENT, "%s/proc/stat: no cpu line to read", sl__sysroot());
	sl__report_copy(out, s, sizeof(*s)); /* what could be read, even so */
	free(s);
	return rc;
}
