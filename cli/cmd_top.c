/*
 * sluice top: a live view, each interval, of the CPUs, memory and page
 * cache, disks and network interfaces (sluice_machine_sample), the GPUs
 * (NVML: utilisation, memory, PCIe throughput) and every running sluice
 * loader on the machine (the figures loaders publish: rates, GPU wait,
 * where the time goes).  Works with no GPU and with no loader.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CLI_MAX_LOADERS 64
#define CLI_MAX_GPUS 16

struct cli_snap {
	struct sluice_machine_sample m; /* t: when it was taken */
	struct sluice_loader_figures ld[CLI_MAX_LOADERS];
	unsigned nld;
};

static void cli_snap_take(struct cli_snap *s)
{
	int n;

	s->m.struct_size = sizeof(s->m);
	(void)sluice_machine_sample(&s->m, -1); /* what /proc gives (a faked one may lack /proc/stat) */
	n = sluice_loaders_published(s->ld, CLI_MAX_LOADERS);
	s->nld = n < 0 ? 0 : n > CLI_MAX_LOADERS ? CLI_MAX_LOADERS : (unsigned)n;
}

static const struct sluice_loader_figures *cli_ld_in(const struct cli_snap *s, int pid, unsigned id)
{
	for (unsigned i = 0; i < s->nld; i++)
		if (s->ld[i].pid == pid && s->ld[i].id == id)
			return &s->ld[i];
	return NULL;
}

/* b - a of a counter, 0 where it went backwards (a counter reset, a faked /proc): never a huge rate. */
static double cli_delta(uint64_t a, uint64_t b)
{
	return b > a ? (double)(b - a) : 0.0;
}

static double cli_fdelta(double a, double b)
{
	return b > a ? b - a : 0.0;
}

/* s for a terminal: control characters (a published loader's page is anyone's to write) shown as '?'. */
static const char *cli_plain(const char *s, char *out, size_t cap)
{
	size_t i = 0;

	for (; s[i] && i + 1 < cap; i++)
		out[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
	out[i] = 0;
	return out;
}

/* Busy and iowait shares of a CPU (or all) between two samples, in %; -1 where nothing was counted. */
static void cli_cpu_pct(const struct sluice_cpu_times *p, const struct sluice_cpu_times *c, double *busy, double *io)
{
	double b = cli_fdelta(p->busy_s, c->busy_s), w = cli_fdelta(p->iowait_s, c->iowait_s);
	double t = b + w + cli_fdelta(p->idle_s, c->idle_s);

	*busy = t > 0 ? 100 * b / t : -1;
	*io = t > 0 ? 100 * w / t : -1;
}

/* The CPUs (all, and each) and host memory with the page cache. */
static void cli_show_cpu_mem(const struct cli_snap *prev, const struct cli_snap *cur, int json)
{
	const struct sluice_machine_sample *p = &prev->m, *c = &cur->m;
	double busy, io, b, w;

	cli_cpu_pct(&p->all, &c->all, &busy, &io);
	if (json) {
		printf("\"cpu\":{\"cpus\":%u,\"busy_pct\":%.1f,\"iowait_pct\":%.1f,\"per_cpu_busy_pct\":[", c->ncpus, busy,
		       io);
		for (unsigned i = 0; i < c->ncpus && i < p->ncpus; i++) {
			cli_cpu_pct(&p->cpu[i], &c->cpu[i], &b, &w);
			printf("%s%.1f", i ? "," : "", b);
		}
		printf("]},\"memory\":{\"total\":%llu,\"available\":%llu,\"page_cache\":%llu,\"dirty\":%llu,\"mlocked\":%llu},",
		       (unsigned long long)c->mem_total, (unsigned long long)c->mem_available,
		       (unsigned long long)c->page_cache, (unsigned long long)c->dirty, (unsigned long long)c->mlocked);
		return;
	}
	printf("CPU   %5.1f%% busy of %u CPUs, %4.1f%% iowait;  each:", busy, c->ncpus, io);
	for (unsigned i = 0; i < c->ncpus && i < p->ncpus; i++) {
		cli_cpu_pct(&p->cpu[i], &c->cpu[i], &b, &w);
		printf(" %3.0f", b);
	}
	printf("\nMEM   %.1f GB of %.1f GB available; page cache %.1f GB, dirty %.1f MB, locked %.1f MB\n\n",
	       (double)c->mem_available / 1e9, (double)c->mem_total / 1e9, (double)c->page_cache / 1e9,
	       (double)c->dirty / 1e6, (double)c->mlocked / 1e6);
}

/* Each disk's rates between the two snapshots. */
static void cli_show_disks(const struct cli_snap *prev, const struct cli_snap *cur, double dt, int json)
{
	unsigned shown = 0;

	if (json)
		printf("\"disks\":[");
	else
		printf("%-10s %10s %10s %9s %9s %6s\n", "DISK", "READ MB/s", "WRITE MB/s", "READ IOPS", "WRITE IOPS", "UTIL%");
	for (unsigned i = 0; i < cur->m.ndisks; i++) {
		const struct sluice_disk_counters *c = &cur->m.disk[i], *p = NULL;
		double rb, wb, ri, wi, ut;

		for (unsigned j = 0; j < prev->m.ndisks && !p; j++)
			p = strcmp(prev->m.disk[j].name, c->name) ? NULL : &prev->m.disk[j];
		if (!p)
			continue;
		rb = cli_delta(p->read_bytes, c->read_bytes) / dt;
		wb = cli_delta(p->write_bytes, c->write_bytes) / dt;
		ri = cli_delta(p->reads, c->reads) / dt;
		wi = cli_delta(p->writes, c->writes) / dt;
		ut = fmin(100, 100 * cli_fdelta(p->busy_s, c->busy_s) / dt);
		if (json) {
			printf("%s{\"name\":", shown++ ? "," : "");
			cli_json_str(c->name);
			printf(",\"read_bytes_per_s\":%.1f,\"write_bytes_per_s\":%.1f,\"read_iops\":%.1f,\"write_iops\":%.1f,"
			       "\"util_pct\":%.1f}", rb, wb, ri, wi, ut);
		} else {
			char nm[32];

			printf("%-10s %10.1f %10.1f %9.0f %9.0f %6.1f\n", cli_plain(c->name, nm, sizeof(nm)), rb / 1e6, wb / 1e6, ri,
			       wi, ut);
		}
	}
	printf(json ? "]," : "\n");
}

/* Each network interface's MB/s between the two snapshots. */
static void cli_show_nics(const struct cli_snap *prev, const struct cli_snap *cur, double dt, int json)
{
	unsigned shown = 0;

	if (json)
		printf("\"nics\":[");
	else
		printf("%-10s %10s %10s\n", "NIC", "IN MB/s", "OUT MB/s");
	for (unsigned i = 0; i < cur->m.nnics; i++) {
		const struct sluice_nic_counters *c = &cur->m.nic[i], *p = NULL;

		for (unsigned j = 0; j < prev->m.nnics && !p; j++)
			p = strcmp(prev->m.nic[j].name, c->name) ? NULL : &prev->m.nic[j];
		if (!p)
			continue;
		if (json) {
			printf("%s{\"name\":", shown++ ? "," : "");
			cli_json_str(c->name);
			printf(",\"rx_bytes_per_s\":%.1f,\"tx_bytes_per_s\":%.1f}", cli_delta(p->rx_bytes, c->rx_bytes) / dt,
			       cli_delta(p->tx_bytes, c->tx_bytes) / dt);
		} else {
			char nm[32];

			printf("%-10s %10.1f %10.1f\n", cli_plain(c->name, nm, sizeof(nm)), cli_delta(p->rx_bytes, c->rx_bytes) / dt / 1e6,
			       cli_delta(p->tx_bytes, c->tx_bytes) / dt / 1e6);
		}
	}
	if (json)
		printf("],\"gpus\":[");
}

/* The GPUs NVML samples now (or why none). */
static void cli_show_gpus(int json)
{
	struct sluice_gpu_sample g[CLI_MAX_GPUS];
	int ng = sluice_gpu_sample(g, CLI_MAX_GPUS);
	const char *gwhy = ng < 0 ? sluice_last_error_detail() : "";

	if (ng > CLI_MAX_GPUS)
		ng = CLI_MAX_GPUS;
	if (json) {
		for (int i = 0; i < ng; i++) {
			printf("%s{\"index\":%u,\"name\":", i ? "," : "", g[i].index);
			cli_json_str(g[i].name);
			printf(",\"util_pct\":%d,\"mem_util_pct\":%d,\"mem_used\":%llu,\"mem_total\":%llu,"
			       "\"pcie_rx_mb_s\":%.1f,\"pcie_tx_mb_s\":%.1f}",
			       g[i].util_pct, g[i].mem_util_pct, (unsigned long long)g[i].mem_used,
			       (unsigned long long)g[i].mem_total, g[i].pcie_rx_mb_s, g[i].pcie_tx_mb_s);
		}
		printf("],\"gpu_error\":");
		cli_json_str(gwhy);
		return;
	}
	printf("\n%-4s %-24s %5s %6s %12s %12s\n", "GPU", "NAME", "UTIL%", "MEM%", "PCIe IN MB/s", "OUT MB/s");
	if (ng <= 0)
		printf("     none (%s)\n", ng < 0 ? gwhy : "NVML sees no GPU");
	for (int i = 0; i < ng; i++)
		printf("%-4u %-24.24s %5d %6.1f %12.0f %12.0f\n", g[i].index, g[i].name, g[i].util_pct,
		       g[i].mem_total ? 100.0 * (double)g[i].mem_used / (double)g[i].mem_total : 0.0, g[i].pcie_rx_mb_s,
		       g[i].pcie_tx_mb_s);
}

/* One running loader's figures, and its rates between the two snapshots. */
static void cli_show_loader(const struct sluice_loader_figures *c, const struct sluice_loader_figures *p, double dt,
			    int json, int first)
{
	double bps = p ? cli_delta(p->batches, c->batches) / dt : 0, rps = p ? cli_delta(p->records, c->records) / dt : 0;
	double byps = p ? cli_delta(p->bytes, c->bytes) / dt : 0;
	/* Since the loader opened: its reads' share through the page cache, and its process's object-cache hits. */
	double pc = c->read_bytes && c->read_bytes_cached <= c->read_bytes
			    ? 100.0 * (double)c->read_bytes_cached / (double)c->read_bytes : -1;
	double looked = (double)c->object_cache_hits + (double)c->object_cache_misses;
	double oc = looked > 0 ? 100.0 * (double)c->object_cache_hits / looked : -1;
	char who[32], ds[32], vd[32];
	size_t dl = strlen(c->dataset);

	if (json) {
		printf("%s{\"pid\":%d,\"id\":%u,\"dataset\":", first ? "" : ",", c->pid, c->id);
		cli_json_str(c->dataset);
		printf(",\"batches\":%llu,\"records\":%llu,\"bytes\":%llu,\"read_bytes\":%llu,\"batches_per_s\":%.2f,"
		       "\"records_per_s\":%.1f,\"bytes_per_s\":%.1f,\"gpu_wait_share\":%.4f,\"read_bytes_cached\":%llu,"
		       "\"object_cache_hits\":%llu,\"object_cache_misses\":%llu,\"verdict\":",
		       (unsigned long long)c->batches, (unsigned long long)c->records, (unsigned long long)c->bytes,
		       (unsigned long long)c->read_bytes, bps, rps, byps, c->gpu_wait_share,
		       (unsigned long long)c->read_bytes_cached, (unsigned long long)c->object_cache_hits,
		       (unsigned long long)c->object_cache_misses);
		cli_json_str(c->verdict);
		printf(",\"stage_seconds\":{\"read\":%.6f,\"decompress\":%.6f,\"storage_wait\":%.6f,\"collate\":%.6f,"
		       "\"h2d\":%.6f,\"consumer_wait\":%.6f},\"wall_s\":%.6f,\"age_s\":%.3f}",
		       c->read_s, c->decompress_s, c->storage_wait_s, c->collate_s, c->h2d_s, c->consumer_wait_s, c->wall_s,
		       c->age_s);
		return;
	}
	snprintf(who, sizeof(who), "%d.%u", c->pid, c->id);
	printf("%-14s %-28s %9.1f %10.0f %9.1f %6.1f%% %-16s %5.0f%% %5.0f%%  %.1f/%.1f/%.1f/%.1f/%.1f\n", who,
	       cli_plain(dl > 28 ? c->dataset + dl - 28 : c->dataset, ds, sizeof(ds)), bps, rps, byps / 1e6,
	       100 * c->gpu_wait_share, cli_plain(c->verdict, vd, sizeof(vd)),
	       pc, oc, c->read_s, c->decompress_s, c->storage_wait_s, c->collate_s, c->h2d_s);
}

static void cli_show(const struct cli_snap *prev, const struct cli_snap *cur, int json, int tty)
{
	double dt = cur->m.t - prev->m.t;

	if (json)
		printf("{\"time\":%.3f,\"interval_s\":%.6f,", (double)time(NULL), dt);
	else
		printf("%ssluice top: every %.1f s (Ctrl-C quits)\n\n", tty ? "\033[H\033[2J" : "", dt);
	cli_show_cpu_mem(prev, cur, json);
	cli_show_disks(prev, cur, dt, json);
	cli_show_nics(prev, cur, dt, json);
	cli_show_gpus(json);
	if (json) {
		printf(",\"loaders\":[");
	} else {
		printf("\n%-14s %-28s %9s %10s %9s %7s %-16s %6s %6s  %s\n", "LOADER", "DATASET", "BATCH/s", "RECORDS/s",
		       "MB/s", "GPU WAIT", "VERDICT", "PCACHE", "OBJHIT", "STAGE SECONDS read/decomp/swait/collate/h2d");
		if (!cur->nld)
			printf("  none running (loaders publish under SLUICE_RUN_DIR, default /dev/shm)\n");
	}
	for (unsigned i = 0; i < cur->nld; i++)
		cli_show_loader(&cur->ld[i], cli_ld_in(prev, cur->ld[i].pid, cur->ld[i].id), dt, json, i == 0);
	printf(json ? "]}\n" : "\n");
	fflush(stdout);
}

int cmd_top(int argc, char **argv)
{
	static struct cli_snap a, b;
	double interval = 1;
	unsigned count = 0;
	int json = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
			char *end;

			interval = strtod(argv[++i], &end);
			if (*end || !(interval >= 0.05 && interval <= 3600))
				return cli_fail("top", "--interval '%s': want seconds from 0.05 to 3600", argv[i]);
		} else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
			if (cli_uint("top", "--count", argv[++i], 1, 1000000000, &count))
				return 2;
		} else if (!strcmp(argv[i], "--help")) {
			printf("usage: sluice top [--interval S] [--count N] [--json]\n\n"
			       "Each interval (default 1 s): the CPUs' busy and iowait shares (all and each), host\n"
			       "memory and the page cache, every disk's read and write MB/s, IOPS and utilisation,\n"
			       "each network interface's MB/s (/proc), each GPU's utilisation, memory and PCIe MB/s\n"
			       "(NVML), and every running sluice loader's batches, records and bytes a second, GPU\n"
			       "wait, stage seconds, the share of its reads through the page cache (PCACHE) and its\n"
			       "process's object-cache hits (OBJHIT).  --count N stops after N samples; --json prints\n"
			       "one object per sample.\n");
			return 0;
		} else
			return cli_fail("top", "unknown option '%s'", argv[i]);
	}
	{
		/* NVML's first use takes a second or more: before the first sample, not inside an interval. */
		struct sluice_gpu_sample g[CLI_MAX_GPUS];

		(void)sluice_gpu_sample(g, CLI_MAX_GPUS);
	}
	cli_snap_take(&a);
	for (unsigned n = 0; !count || n < count; n++) {
		struct cli_snap *prev = n % 2 ? &b : &a, *cur = n % 2 ? &a : &b;

		usleep((useconds_t)(interval * 1e6));
		cli_snap_take(cur);
		cli_show(prev, cur, json, !json && isatty(1));
	}
	return 0;
}
