/*
 * sluice_machine_sample over a faked /proc and /sys (SLUICE_SYSROOT): the
 * counters as written, a process tree found from its root (a child, a
 * grandchild, a stranger left out, a name with spaces and parentheses),
 * and hostile text (lines cut short, words for numbers, an endless line,
 * no cpu line at all) parsed without a crash or a made-up figure; then
 * the machine's own /proc, this process first in its tree.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t_util.h"

static char root[512];

static void put(const char *rel, const char *text)
{
	char p[1024], dir[1024], *slash;
	FILE *f;

	snprintf(p, sizeof(p), "%s%s", root, rel);
	snprintf(dir, sizeof(dir), "%s", p);
	for (slash = strchr(dir + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = 0;
		mkdir(dir, 0755);
		*slash = '/';
	}
	T_CHECK((f = fopen(p, "w")) != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static void proc(int pid, int ppid, const char *comm, unsigned long long ut, unsigned long long st, long long rss,
		 unsigned long long rb)
{
	char rel[64], text[1024];

	snprintf(rel, sizeof(rel), "/proc/%d/stat", pid);
	snprintf(text, sizeof(text),
		 "%d (%s) S %d %d %d 0 -1 4194560 100 0 0 0 %llu %llu 0 0 20 0 4 0 1000 123456789 %lld 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		 pid, comm, ppid, pid, pid, ut, st, rss);
	put(rel, text);
	snprintf(rel, sizeof(rel), "/proc/%d/io", pid);
	snprintf(text, sizeof(text), "rchar: %llu\nwchar: 0\nsyscr: 1\nsyscw: 0\nread_bytes: %llu\nwrite_bytes: 0\n",
		 rb * 4, rb);
	put(rel, text);
}

int main(void)
{
	struct sluice_machine_sample *s = calloc(1, sizeof(*s));
	char big[70000];
	long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);

	snprintf(root, sizeof(root), "%s", t_dir("t_machine"));
	put("/proc/stat", "cpu  100 0 50 800 20 5 5 0 0 0\ncpu0 60 0 30 400 10 5 5 0 0 0\ncpu1 40 0 20 400 10 0 0 0 0 0\n"
			  "intr 12345\nctxt 99\n");
	put("/proc/meminfo", "MemTotal:       16000 kB\nMemFree:        1000 kB\nMemAvailable:   8000 kB\n"
			     "Buffers:        10 kB\nCached:         4000 kB\nSwapCached:     0 kB\nDirty:          12 kB\n"
			     "Mlocked:        64 kB\n");
	put("/proc/diskstats", "   8       0 sda 1000 0 2048 500 10 0 80 20 0 700 720\n"
			       "   8       1 sda1 900 0 2000 400 10 0 80 20 0 600 620\n"
			       "   7       0 loop0 5 0 10 1 0 0 0 0 0 1 1\n");
	put("/sys/block/sda/size", "1000\n");
	put("/proc/net/dev", "Inter-|   Receive                                                |  Transmit\n"
			     " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
			     "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
			     "  eth0: 5000 10 0 0 0 0 0 0 7000 12 0 0 0 0 0 0\n");
	proc(100, 1, "python3", 300, 100, 1000, 4096);
	proc(101, 100, "pt_data_worker", 50, 10, 500, 8192);
	proc(102, 101, "a (b) c", 1, 1, 10, 0);
	proc(200, 1, "stranger", 999, 999, 1, 1);
	setenv("SLUICE_SYSROOT", root, 1);

	T_CHECK(sluice_machine_sample(s, 100) == SLUICE_EINVAL_CONFIG); /* no struct_size */
	s->struct_size = sizeof(*s);
	T_CHECK(sluice_machine_sample(s, 100) == 0);
	T_CHECK(s->ncpus == 2 && s->all.busy_s == (double)160 / tck && s->all.idle_s == (double)800 / tck &&
		s->all.iowait_s == (double)20 / tck && s->cpu[1].busy_s == (double)60 / tck);
	T_CHECK(s->mem_total == 16000 << 10 && s->mem_available == 8000 << 10 && s->page_cache == 4000 << 10 &&
		s->dirty == 12 << 10 && s->mlocked == 64 << 10);
	T_CHECK(s->ndisks == 1 && !strcmp(s->disk[0].name, "sda") && s->disk[0].reads == 1000 &&
		s->disk[0].read_bytes == 2048 * 512 && s->disk[0].read_wait_s == 0.5 && s->disk[0].busy_s == 0.7);
	T_CHECK(s->nnics == 1 && !strcmp(s->nic[0].name, "eth0") && s->nic[0].rx_bytes == 5000 &&
		s->nic[0].tx_bytes == 7000);
	T_CHECK(s->nprocs == 3 && s->proc[0].pid == 100 && s->proc[1].pid == 101 && s->proc[2].pid == 102);
	T_CHECK(!strcmp(s->proc[2].name, "a (b) c") && s->proc[2].ppid == 101);
	T_CHECK(s->proc[0].cpu_s == (double)400 / tck && s->proc[0].rss == 1000ull * (uint64_t)page &&
		s->proc[0].read_bytes == 4096 && s->proc[0].rchar == 4 * 4096 && !s->procs_left_out);

	/* The same tree from the kernel's children files (a thread's own list), no scan of every process. */
	put("/proc/100/task/100/children", "");
	put("/proc/100/task/7/children", "101 ");
	put("/proc/101/task/101/children", "102 x 999999999999 -4");
	T_CHECK(sluice_machine_sample(s, 100) == 0);
	T_CHECK(s->nprocs == 3 && s->proc[1].pid == 101 && s->proc[2].pid == 102);
	put("/proc/100/task/100/children", "200 ");
	T_CHECK(sluice_machine_sample(s, 100) == 0); /* the stranger now a child: found only through the file */
	T_CHECK(s->nprocs == 4 && s->proc[1].pid == 200);

	/* Hostile text: each line that does not parse is skipped; nothing is made up. */
	put("/proc/100/task/100/children", "");
	put("/proc/100/task/7/children", "");
	memset(big, '9', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	put("/proc/stat", "cpu  1 2\ncpu0 x y z w\ncpuX 1 1 1 1 1\ncpu 10 0 0 10 0 0 0 0\n");
	put("/proc/meminfo", big);
	put("/proc/diskstats", "8 0 sda 1 2\nnot a line at all\n   8 0 ../../etc 1 0 2 3 4 0 5 6 0 7 8\n");
	put("/proc/net/dev", "eth0 5000\n:\n  eth1: 1 2 3\n" "  a-name-longer-than-thirty-one-characters-in-all: 1 0 0 0 0 0 0 0 2 0 0 0 0 0 0 0\n");
	proc(100, 100, "self parent", 1, 1, -5, 0); /* its own parent: no endless tree */
	put("/proc/101/stat", "101 (no close paren S 100 1 1");
	T_CHECK(sluice_machine_sample(s, 100) == 0);
	T_CHECK(s->ncpus == 0 && s->all.busy_s == (double)10 / tck);
	T_CHECK(s->mem_total == 0 && s->ndisks == 0 && s->nnics == 0);
	T_CHECK(s->nprocs == 1 && s->proc[0].rss == 0);
	put("/proc/stat", "intr 1\n");
	T_CHECK(sluice_machine_sample(s, -1) == -ENOENT);

	/* The machine's own. */
	unsetenv("SLUICE_SYSROOT");
	T_CHECK(sluice_machine_sample(s, 0) == 0);
	T_CHECK(s->ncpus >= 1 && s->all.busy_s + s->all.idle_s > 0 && s->mem_total > 0);
	T_CHECK(s->nprocs >= 1 && s->proc[0].pid == (int)getpid() && s->proc[0].cpu_s >= 0);
	free(s);
	return t_done("t_machine");
}
