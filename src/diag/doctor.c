/*
 * sluice_doctor (sluice.h): what on this machine stands between storage and
 * the GPU: the GPU and its PCIe link, GPUDirect Storage, the file system,
 * NUMA placement, the IOMMU, io_uring, the memlock limit, cgroup limits,
 * the block device and huge pages; a remote PATH's endpoint (asked once,
 * as a read asks it).  Each check reads
 * procfs and sysfs under SLUICE_SYSROOT (default "/": a container that
 * mounts the host's /sys and /proc elsewhere, and the tests' faked trees)
 * and gives a verdict, the value it measured, why it matters and the
 * command that fixes it.  Probes that cannot be faked (loading cuFile,
 * creating an io_uring) run only against the real root.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/core.h"
#include "store/names.h"
#include "store/store.h"

#define SL_MAX_GPUS 64

struct sl_dr {
	const char *root; /* "" for the real one */
	const char *path; /* the user's PATH */
	char shown[4096]; /* and as messages name it (sluice_url_redact: no query, no password) */
	sluice_check_fn fn;
	void *arg;
	int stop;         /* fn's nonzero return */
	char gpus[SL_MAX_GPUS][64];
	unsigned ngpus;
	char disk[PATH_MAX]; /* the PATH's block device's sysfs dir ("" if none) */
	char disk_name[64];
	char fstype[64];
	uint64_t pool;    /* the pinned pool sluice would use */
	unsigned threads, ring_entries; /* the workers and their rings' size, as the engine would make them */
};

/* Reads root/fmt... into buf (at most cap - 1 bytes), trailing white space cut; 0 or -errno. */
static int SL_PRINTF(4, 5) sl_rd(const struct sl_dr *d, char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	(void)d; /* d->root is sl__sysroot(), which sl__sys_vread reads under */
	va_start(ap, fmt);
	rc = sl__sys_vread(buf, cap, fmt, ap);
	va_end(ap);
	return rc;
	return 0;
}

static void SL_PRINTF(5, 6) sl_emit(struct sl_dr *d, const char *name, enum sluice_verdict v, const char *why,
				    const char *fmt, ...)
{
	char value[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(value, sizeof(value), fmt, ap);
	va_end(ap);
	if (!d->stop)
		d->stop = d->fn(&(struct sluice_check){ name, v, value, why, "" }, d->arg);
}

/* As sl_emit with a fix (a printf format's result, then the value's). */
static void sl_emit_fix(struct sl_dr *d, const char *name, enum sluice_verdict v, const char *why, const char *fix,
			const char *value)
{
	if (!d->stop)
		d->stop = d->fn(&(struct sluice_check){ name, v, value, why, v == SLUICE_CHECK_OK ? "" : fix }, d->arg);
}

static int sl_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* NVIDIA GPUs (and 3D controllers) on the PCI bus, sorted by address. */
static void sl_find_gpus(struct sl_dr *d)
{
	char p[PATH_MAX], v[64], c[64];
	struct dirent *e;
	DIR *dir;

	snprintf(p, sizeof(p), "%s/sys/bus/pci/devices", d->root);
	dir = opendir(p);
	if (!dir)
		return;
	while ((e = readdir(dir)) && d->ngpus < SL_MAX_GPUS) {
		if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(d->gpus[0]))
			continue;
		if (sl_rd(d, v, sizeof(v), "/sys/bus/pci/devices/%s/vendor", e->d_name) ||
		    sl_rd(d, c, sizeof(c), "/sys/bus/pci/devices/%s/class", e->d_name))
			continue;
		if (!strcmp(v, "0x10de") && (!strncmp(c, "0x0300", 6) || !strncmp(c, "0x0302", 6)))
			snprintf(d->gpus[d->ngpus++], sizeof(d->gpus[0]), "%.63s", e->d_name);
	}
	closedir(dir);
	qsort(d->gpus, d->ngpus, sizeof(d->gpus[0]), sl_cmp);
}

static void sl_check_gpu(struct sl_dr *d)
{
	static const char why[] = "sluice moves data into GPU memory; without a GPU and its driver it reads into host memory";
	char ver[512], list[512] = "";
	const char *k;
	size_t l = 0;

	for (unsigned i = 0; i < d->ngpus && l < sizeof(list); i++)
		l += (size_t)snprintf(list + l, sizeof(list) - l, "%s%s", i ? " " : "", d->gpus[i]);
	if (!d->ngpus) {
		sl_emit_fix(d, "gpu", SLUICE_CHECK_WARN, why,
			    "run on a machine with an NVIDIA GPU (without one, sluice reads into host memory)",
			    "no NVIDIA GPU on the PCI bus");
		return;
	}
	if (sl_rd(d, ver, sizeof(ver), "/proc/driver/nvidia/version")) {
		char v[1100];

		snprintf(v, sizeof(v), "%u NVIDIA GPU%s (%s), no driver loaded", d->ngpus, d->ngpus > 1 ? "s" : "", list);
		sl_emit_fix(d, "gpu", SLUICE_CHECK_FAIL, why, "sudo modprobe nvidia (install the NVIDIA driver first)", v);
		return;
	}
	/*
	 * "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ..." or
	 * "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...":
	 * the version is the first word after "Module" that starts with digits and a dot.
	 */
	k = strstr(ver, "Module");
	for (k = k ? k : ver; *k; k++) {
		size_t dg = strspn(k, "0123456789");

		if (dg && k[dg] == '.' && (k == ver || k[-1] == ' ' || k[-1] == '\t'))
			break;
	}
	sl_emit(d, "gpu", SLUICE_CHECK_OK, why, "%u NVIDIA GPU%s (%s), driver %.*s", d->ngpus, d->ngpus > 1 ? "s" : "",
		list, *k ? (int)strcspn(k, " \t\n") : 7, *k ? k : "unknown");
}

static void sl_check_gds(struct sl_dr *d)
{
	static const char why[] = "GPUDirect Storage lets the disk write straight into GPU memory; without nvidia-fs, cuFile "
				  "runs in compat mode (its own bounce buffers), which sluice does not use: it reads "
				  "through io_uring into its own pinned pipeline";
	int nvfs = sl__nvfs_loaded(); /* as the engine asks */
	void *h = NULL;

	if (!d->ngpus) {
		sl_emit(d, "gds", SLUICE_CHECK_OK, why, "not applicable (no GPU)");
		return;
	}
	if (!d->root[0])
		h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	if (h)
		dlclose(h);
	if (nvfs)
		sl_emit(d, "gds", SLUICE_CHECK_OK, why, "nvidia-fs loaded%s; sluice uses cuFile (SLUICE_BACKEND=gds forces it)",
			h ? ", libcufile.so.0 loads" : d->root[0] ? "" : ", but libcufile.so.0 does not load");
	else
		sl_emit_fix(d, "gds", SLUICE_CHECK_WARN, why,
			    "sudo apt-get install nvidia-gds && sudo modprobe nvidia-fs (needs a GDS-capable file system: ext4/xfs on NVMe, or a parallel FS)",
			    h ? "GDS not used: nvidia-fs is not loaded (libcufile.so.0 loads, so cuFile would run in compat mode)"
			      : "GDS not used: nvidia-fs is not loaded and libcufile.so.0 does not load");
}

/* "16.0 GT/s PCIe" -> the PCIe generation, 0 if unknown. */
static int sl_gen(const char *s)
{
	static const double gts[] = { 2.5, 5, 8, 16, 32, 64 };
	double v = strtod(s, NULL);

	for (int i = 0; i < 6; i++)
		if (v > gts[i] - 0.1 && v < gts[i] + 0.1)
			return i + 1;
	return 0;
}

static void sl_check_pcie(struct sl_dr *d)
{
	static const char why[] = "every byte into the GPU crosses this link: a Gen4 x16 link moves about 25 GB/s, "
				  "each generation or halved width less is half that";

	if (!d->ngpus)
		sl_emit(d, "pcie_link", SLUICE_CHECK_OK, why, "not applicable (no GPU)");
	for (unsigned i = 0; i < d->ngpus; i++) {
		char cs[64], cw[64], ms[64], mw[64], v[512], fix[512];
		int cg, mg;
		long w, mwid;

		if (sl_rd(d, cs, sizeof(cs), "/sys/bus/pci/devices/%s/current_link_speed", d->gpus[i]) ||
		    sl_rd(d, cw, sizeof(cw), "/sys/bus/pci/devices/%s/current_link_width", d->gpus[i]) ||
		    sl_rd(d, ms, sizeof(ms), "/sys/bus/pci/devices/%s/max_link_speed", d->gpus[i]) ||
		    sl_rd(d, mw, sizeof(mw), "/sys/bus/pci/devices/%s/max_link_width", d->gpus[i]) ||
		    !(cg = sl_gen(cs)) || !(mg = sl_gen(ms))) {
			sl_emit(d, "pcie_link", SLUICE_CHECK_OK, why,
				"%s: link not reported (a virtual machine's emulated bus)", d->gpus[i]);
			continue;
		}
		w = strtol(cw, NULL, 10);
		mwid = strtol(mw, NULL, 10);
		snprintf(v, sizeof(v), "%s: Gen%d x%ld (the device's maximum Gen%d x%ld)", d->gpus[i], cg, w, mg, mwid);
		if (w < mwid) {
			snprintf(fix, sizeof(fix),
				 "the link trained to fewer lanes: reseat the card or move it to a x%ld slot; check the "
				 "BIOS's slot bifurcation (sudo lspci -vv -s %s | grep LnkSta)", mwid, d->gpus[i]);
			sl_emit_fix(d, "pcie_link", SLUICE_CHECK_FAIL, why, fix, v);
		} else if (cg < mg) {
			/* GPUs lower the link's speed while idle: only a slow link under load is a fault. */
			snprintf(fix, sizeof(fix),
				 "an idle GPU lowers its link speed to save power; check it under load (nvidia-smi -q -d "
				 "PCIE while sluice bench runs); if it stays low, check the slot and the BIOS's PCIe "
				 "generation setting");
			strncat(v, ", lower speed (idle?)", sizeof(v) - strlen(v) - 1);
			sl_emit_fix(d, "pcie_link", SLUICE_CHECK_WARN, why, fix, v);
		} else {
			sl_emit_fix(d, "pcie_link", SLUICE_CHECK_OK, why, "", v);
		}
	}
}

/* The NUMA node in dir/numa_node (or its device's); -1 if none. */
static int sl_numa_of(const struct sl_dr *d, const char *rel)
{
	char v[32];

	if (sl_rd(d, v, sizeof(v), "%s/numa_node", rel) && sl_rd(d, v, sizeof(v), "%s/device/numa_node", rel) &&
	    sl_rd(d, v, sizeof(v), "%s/device/device/numa_node", rel))
		return -1;
	return (int)strtol(v, NULL, 10);
}

static void sl_check_numa(struct sl_dr *d)
{
	static const char why[] = "a GPU and a disk on different sockets send every byte over the link between them, "
				  "and a worker on the wrong socket copies through remote memory";
	char rel[PATH_MAX + 64], v[512], fix[512];
	int gn = -1, dn = -1, nodes = 0;
	struct dirent *e;
	DIR *dir;

	snprintf(rel, sizeof(rel), "%s/sys/devices/system/node", d->root);
	if ((dir = opendir(rel))) {
		while ((e = readdir(dir)))
			nodes += !strncmp(e->d_name, "node", 4) && e->d_name[4] >= '0' && e->d_name[4] <= '9';
		closedir(dir);
	}
	if (d->ngpus) {
		snprintf(rel, sizeof(rel), "/sys/bus/pci/devices/%s", d->gpus[0]);
		gn = sl_numa_of(d, rel);
	}
	if (d->disk[0])
		dn = sl_numa_of(d, d->disk + strlen(d->root));
	{
		char g[96] = "no GPU", k[96] = "no block device";

		if (d->ngpus)
			snprintf(g, sizeof(g), "GPU %s on node %d", d->gpus[0], gn);
		if (d->disk_name[0])
			snprintf(k, sizeof(k), "%s on node %d", d->disk_name, dn);
		snprintf(v, sizeof(v), "%d node%s; %s; %s (-1: not reported)", nodes, nodes == 1 ? "" : "s", g, k);
	}
	if (nodes > 1 && gn >= 0 && dn >= 0 && gn != dn) {
		snprintf(fix, sizeof(fix),
			 "use a GPU on node %d, or keep the data on a disk of node %d; run the job under "
			 "numactl --cpunodebind=%d --membind=%d",
			 dn, gn, gn, gn);
		sl_emit_fix(d, "numa", SLUICE_CHECK_WARN, why, fix, v);
	} else {
		sl_emit_fix(d, "numa", SLUICE_CHECK_OK, why, "", v);
	}
}

static void sl_check_iommu(struct sl_dr *d)
{
	static const char why[] = "an IOMMU translating DMA slows peer-to-peer and GPUDirect transfers, and GDS needs "
				  "it off or in passthrough";
	char p[PATH_MAX], cmd[4096] = "";
	struct dirent *e;
	int groups = 0;
	DIR *dir;

	snprintf(p, sizeof(p), "%s/sys/class/iommu", d->root);
	if ((dir = opendir(p))) {
		while ((e = readdir(dir)))
			groups += e->d_name[0] != '.';
		closedir(dir);
	}
	sl_rd(d, cmd, sizeof(cmd), "/proc/cmdline");
	if (!groups)
		sl_emit(d, "iommu", SLUICE_CHECK_OK, why, "off (no IOMMU units in /sys/class/iommu)");
	else if (strstr(cmd, "iommu=pt") || strstr(cmd, "iommu.passthrough=1"))
		sl_emit(d, "iommu", SLUICE_CHECK_OK, why, "%d unit%s, passthrough (iommu=pt)", groups, groups > 1 ? "s" : "");
	else {
		char v[128];

		snprintf(v, sizeof(v), "%d unit%s, translating DMA (no iommu=pt on the kernel command line)", groups,
			 groups > 1 ? "s" : "");
		sl_emit_fix(d, "iommu", SLUICE_CHECK_WARN, why,
			    "add iommu=pt (intel_iommu=on iommu=pt on Intel) to GRUB_CMDLINE_LINUX in /etc/default/grub, "
			    "then sudo update-grub and reboot",
			    v);
	}
}

static void sl_check_uring(struct sl_dr *d)
{
	static const char why[] = "sluice submits its reads through io_uring; without it, it falls back to a "
				  "thread pool of pread calls, with more CPU per GB";
	char rel[128] = "?", dis[16] = "", st[8192] = "", v[512];
	int maj = 0, min = 0, seccomp = 0, probe = 0;
	const char *s;

	sl_rd(d, rel, sizeof(rel), "/proc/sys/kernel/osrelease");
	sscanf(rel, "%d.%d", &maj, &min);
	sl_rd(d, dis, sizeof(dis), "/proc/sys/kernel/io_uring_disabled");
	if (!sl_rd(d, st, sizeof(st), "/proc/self/status") && (s = strstr(st, "Seccomp:")))
		seccomp = atoi(s + 8);
	if (!d->root[0])
		probe = sl__uring_try(0, d->ring_entries, d->threads); /* the engine's own probe */
	snprintf(v, sizeof(v), "kernel %s, io_uring_disabled=%s, seccomp %s%s%s", rel, dis[0] ? dis : "(absent)",
		 seccomp == 2 ? "filter" : seccomp == 1 ? "strict" : "off", probe ? ", io_uring_setup: " : "",
		 probe ? strerror(-probe) : "");
	if (maj * 100 + min < 506)
		sl_emit_fix(d, "io_uring", SLUICE_CHECK_FAIL, why, "run a kernel of 5.6 or later (5.19+ for every feature sluice uses)", v);
	else if (!strcmp(dis, "2"))
		sl_emit_fix(d, "io_uring", SLUICE_CHECK_FAIL, why, "sudo sysctl -w kernel.io_uring_disabled=0", v);
	else if (probe == -ENOMEM)
		sl_emit_fix(d, "io_uring", SLUICE_CHECK_FAIL, why,
			    "io_uring's rings count against the memlock limit, too low here: ulimit -l unlimited "
			    "(systemd LimitMEMLOCK=infinity; docker --ulimit memlock=-1; Kubernetes: the runtime's default)", v);
	else if (probe && seccomp == 2)
		sl_emit_fix(d, "io_uring", SLUICE_CHECK_FAIL, why,
			    "a seccomp profile blocks io_uring: docker run --security-opt seccomp=PROFILE allowing "
			    "io_uring_setup, io_uring_enter and io_uring_register (Kubernetes: securityContext.seccompProfile)",
			    v);
	else if (probe || !strcmp(dis, "1"))
		sl_emit_fix(d, "io_uring", SLUICE_CHECK_WARN, why,
			    "sudo sysctl -w kernel.io_uring_disabled=0 (1 allows only the group in kernel.io_uring_group)", v);
	else
		sl_emit_fix(d, "io_uring", SLUICE_CHECK_OK, why, "", v);
}

/* A size for people: 1.5 GiB. */
static const char *sl_sz(char *b, size_t cap, uint64_t v)
{
	static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double x = (double)v;
	int i = 0;

	while (x >= 1024 && i < 5)
		x /= 1024, i++;
	snprintf(b, cap, i ? "%.1f %s" : "%.0f %s", x, u[i]);
	return b;
}

static void sl_check_memlock(struct sl_dr *d)
{
	static const char why[] = "io_uring's registered buffers count against the memlock limit of a process "
				  "without CAP_IPC_LOCK; under it sluice registers no buffers and the kernel maps "
				  "each I/O's pages again";
	char v[256], a[32], b[32];
	uint64_t soft = 0;
	int unl = 0, ipc_lock = 0;

	if (sl__memlock(&soft, &unl, &ipc_lock)) {
		sl_emit(d, "memlock", SLUICE_CHECK_OK, why, "not reported");
		return;
	}
	snprintf(v, sizeof(v), "%s against a pinned pool of %s%s", unl ? "unlimited" : sl_sz(a, sizeof(a), soft),
		 sl_sz(b, sizeof(b), d->pool), ipc_lock && !unl ? " (CAP_IPC_LOCK: not enforced)" : "");
	sl_emit_fix(d, "memlock", unl || ipc_lock || soft >= d->pool ? SLUICE_CHECK_OK : SLUICE_CHECK_WARN, why,
		    "ulimit -l unlimited (systemd: LimitMEMLOCK=infinity; docker: --ulimit memlock=-1; "
		    "/etc/security/limits.conf: * - memlock unlimited)",
		    v);
}

static void sl_check_cgroup(struct sl_dr *d)
{
	static const char why[] = "a container's cgroup can cap memory (pinned buffers, page cache) and a disk's "
				  "bytes and IOPS below what the hardware gives";
	char cg[4096], mem[64] = "", io[4096] = "", v[1024], a[32], dev[80] = "", fix[512];
	const char *s, *lim = NULL;
	struct stat stt;

	if (sl_rd(d, cg, sizeof(cg), "/proc/self/cgroup") || !(s = strstr(cg, "0::"))) {
		sl_emit(d, "cgroup", SLUICE_CHECK_OK, why, "no cgroup v2 hierarchy (v1 limits not checked)");
		return;
	}
	s += 3;
	{
		char path[4096];
		int n = (int)strcspn(s, "\n");

		snprintf(path, sizeof(path), "%.*s", n, s);
		if (!strcmp(path, "/"))
			path[0] = 0;
		sl_rd(d, mem, sizeof(mem), "/sys/fs/cgroup%s/memory.max", path);
		sl_rd(d, io, sizeof(io), "/sys/fs/cgroup%s/io.max", path);
	}
	if (d->path && sl__fs_is_local(d->path) && !stat(d->path, &stt) && major(stt.st_dev)) {
		/* io.max names the whole disk, not the partition. */
		char dd[64] = "";

		if (d->disk[0] && !sl_rd(d, dd, sizeof(dd), "%s/dev", d->disk + strlen(d->root)))
			snprintf(dev, sizeof(dev), "%s ", dd);
	}
	if (dev[0] && (lim = strstr(io, dev)))
		lim += strlen(dev);
	snprintf(v, sizeof(v), "memory.max %s; io.max %s%.*s", mem[0] ? (strcmp(mem, "max") ? sl_sz(a, sizeof(a), strtoull(mem, NULL, 10)) : "unlimited") : "(none)",
		 lim ? "" : "no limit on this disk", lim ? (int)strcspn(lim, "\n") : 0, lim ? lim : "");
	if (mem[0] && strcmp(mem, "max") && strtoull(mem, NULL, 10) < d->pool + (1ull << 30)) {
		snprintf(fix, sizeof(fix), "raise the container's memory limit above %s (docker --memory, Kubernetes "
			 "resources.limits.memory)", sl_sz(a, sizeof(a), d->pool + (1ull << 30)));
		sl_emit_fix(d, "cgroup", SLUICE_CHECK_FAIL, why, fix, v);
	} else if (lim && (strstr(lim, "rbps=") || strstr(lim, "riops="))) {
		char *p = strstr(lim, "rbps=");

		if ((p && strncmp(p + 5, "max", 3)) || ((p = strstr(lim, "riops=")) && strncmp(p + 6, "max", 3))) {
			snprintf(fix, sizeof(fix), "lift the read limit: echo '%smax rbps=max riops=max' > "
				 "/sys/fs/cgroup/.../io.max (docker: drop --device-read-bps)", dev);
			sl_emit_fix(d, "cgroup", SLUICE_CHECK_WARN, why, fix, v);
		} else {
			sl_emit_fix(d, "cgroup", SLUICE_CHECK_OK, why, "", v);
		}
	} else {
		sl_emit_fix(d, "cgroup", SLUICE_CHECK_OK, why, "", v);
	}
}

/* Unescapes mountinfo's \040-style octal escapes in place. */
static void sl_unoct(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
}

/*
 * A remote PATH (s3://, http(s)://) asked for once, as a read would ask it (the store's info: HEAD, a listing),
 * retries and all: what the endpoint says, or what failed on the way, as the transport names it (a name that
 * does not resolve, nothing listening, no answer in time, credentials refused).  A local PATH is the file
 * system check's.
 */
static void sl_check_storage(struct sl_dr *d)
{
	static const char why[] = "every byte of a remote PATH comes through its endpoint: one that cannot be reached "
				  "fails every read";
	const struct sl__store *st = sl__store_of(d->path);
	char where[512] = "", v[8192];
	const char *fix;
	struct sl__entry e;
	int rc;

	if (st->caps & SL_STORE_LOCAL)
		return;
	if (st->where)
		st->where(where, sizeof(where));
	sl__err_clear();
	rc = st->info(d->path, &e);
	if (!rc) {
		if (e.kind == SL_KIND_DIR)
			sl_emit(d, "storage", SLUICE_CHECK_OK, why, "%s: a directory%s%s", d->shown, *where ? " at " : "",
				where);
		else
			sl_emit(d, "storage", SLUICE_CHECK_OK, why, "%s: a file of %llu bytes%s%s", d->shown,
				(unsigned long long)e.size, *where ? " at " : "", where);
		return;
	}
	switch (rc) {
	case SLUICE_ERESOLVE:
		fix = "the host name does not resolve: check the endpoint (AWS_ENDPOINT_URL, or the URL's host) and "
		      "this machine's DNS (getent hosts HOST)";
		break;
	case -ECONNREFUSED:
		fix = "nothing listens there: check the endpoint's host and port (AWS_ENDPOINT_URL, or the URL's), and "
		      "that its server runs";
		break;
	case -ETIMEDOUT:
		fix = "the endpoint did not answer in time: a firewall, a proxy (HTTPS_PROXY), or a server too busy";
		break;
	case -EACCES:
		fix = "the endpoint refused the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
		      "or the bucket's policy";
		break;
	case -ENOENT:
		fix = "the endpoint answered, but nothing is there: check the bucket and the key or prefix";
		break;
	case -EKEYREJECTED:
		fix = "trust the server's certificate: AWS_CA_BUNDLE or SSL_CERT_FILE (its CA's bundle)";
		break;
	case SLUICE_EINVAL_CONFIG:
		fix = "the PATH or a setting is wrong, as said (a bucket's PATH is s3://BUCKET[/PREFIX])";
		break;
	default:
		fix = "the value says what failed";
	}
	/* The detail names the path already where the store said it: once is enough. */
	if (strstr(sluice_last_error_detail(), d->shown))
		snprintf(v, sizeof(v), "%s: %s%s%s%s", sluice_strerror(rc), sluice_last_error_detail(),
			 *where ? " (endpoint " : "", where, *where ? ")" : "");
	else
		snprintf(v, sizeof(v), "%s: %s: %s%s%s%s", d->shown, sluice_strerror(rc), sluice_last_error_detail(),
			 *where ? " (endpoint " : "", where, *where ? ")" : "");
	sl_emit_fix(d, "storage", SLUICE_CHECK_FAIL, why, fix, v);
}

static void sl_check_fs(struct sl_dr *d)
{
	static const char why[] = "the file system decides whether O_DIRECT works and how each read reaches the disk";
	char real[PATH_MAX], p[PATH_MAX], best_mp[PATH_MAX] = "", best_opt[1024] = "", best_src[512] = "", line[8192];
	char v[PATH_MAX * 2 + 2048], fix[PATH_MAX + 256];
	size_t best = 0;
	FILE *f;

	if (!sl__fs_is_local(d->path)) {
		sl_emit(d, "filesystem", SLUICE_CHECK_OK, why, "%s: the %s store (no local file system)", d->shown,
			sluice_path_store(d->path, NULL));
		return;
	}
	if (!realpath(d->path, real)) {
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_FAIL, why, "give a PATH that exists (the data's directory)",
			    strerror(errno));
		return;
	}
	snprintf(p, sizeof(p), "%s/proc/self/mountinfo", d->root);
	if (!(f = fopen(p, "re"))) {
		sl_emit(d, "filesystem", SLUICE_CHECK_OK, why, "%s: mounts not reported", real);
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		/* id parent maj:min root mountpoint options [optional...] - fstype source superopts */
		char mp[PATH_MAX], opt[1024], fs[64], src[512];
		const char *dash = strstr(line, " - ");
		size_t n;

		if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s %1023s", mp, opt) != 2 ||
		    sscanf(dash + 3, "%63s %511s", fs, src) != 2)
			continue;
		sl_unoct(mp);
		n = strlen(mp);
		if (!strncmp(real, mp, n) && (real[n] == '/' || real[n] == 0 || n == 1) && n >= best) {
			best = n;
			snprintf(best_mp, sizeof(best_mp), "%s", mp);
			snprintf(best_opt, sizeof(best_opt), "%s", opt);
			snprintf(d->fstype, sizeof(d->fstype), "%s", fs);
			snprintf(best_src, sizeof(best_src), "%s", src);
		}
	}
	fclose(f);
	if (!best_mp[0]) {
		sl_emit(d, "filesystem", SLUICE_CHECK_OK, why, "%s: no mount found", real);
		return;
	}
	snprintf(v, sizeof(v), "%s: %s on %s at %s (%s)", real, d->fstype, best_src, best_mp, best_opt);
	if (!strncmp(d->fstype, "nfs", 3)) {
		snprintf(fix, sizeof(fix), "mount with -o nconnect=16,rsize=1048576 for parallel streams; or copy the "
			 "shards to local NVMe (sluice cp)");
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_WARN, why, fix, v);
	} else if (!strncmp(d->fstype, "fuse", 4)) {
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_WARN, why,
			    "FUSE adds a copy through user space and may refuse O_DIRECT: read s3:// directly, or copy "
			    "the data to a local file system",
			    v);
	} else if (!strcmp(d->fstype, "overlay")) {
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_WARN, why,
			    "a container's overlay layer: put the data on a volume (docker -v /data:/data)", v);
	} else if (strstr(best_opt, "sync") && !strstr(best_opt, "async")) {
		snprintf(fix, sizeof(fix), "sudo mount -o remount,async %s", best_mp);
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_WARN, why, fix, v);
	} else if (strstr(best_opt, "strictatime") ||
		   (!strstr(best_opt, "noatime") && !strstr(best_opt, "relatime") && strcmp(d->fstype, "tmpfs"))) {
		snprintf(fix, sizeof(fix), "every read writes an access time: sudo mount -o remount,noatime %s", best_mp);
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_WARN, why, fix, v);
	} else {
		sl_emit_fix(d, "filesystem", SLUICE_CHECK_OK, why, "", v);
	}
}

/* The sysfs directory of PATH's whole disk into d->disk, or "" (tmpfs, overlay, NFS, objects). */
static void sl_find_disk(struct sl_dr *d)
{
	char p[PATH_MAX], r[PATH_MAX], q[PATH_MAX + 16];
	struct stat st;

	if (!sl__fs_is_local(d->path) || stat(d->path, &st) || !major(st.st_dev))
		return;
	snprintf(p, sizeof(p), "%s/sys/dev/block/%u:%u", d->root, major(st.st_dev), minor(st.st_dev));
	if (!realpath(p, r))
		return;
	snprintf(q, sizeof(q), "%s/partition", r);
	if (!access(q, F_OK))
		*strrchr(r, '/') = 0;
	if (strncmp(r, d->root, strlen(d->root)))
		return;
	snprintf(d->disk, sizeof(d->disk), "%s", r);
	snprintf(d->disk_name, sizeof(d->disk_name), "%s", strrchr(r, '/') + 1);
}

static void sl_check_block(struct sl_dr *d)
{
	static const char why_s[] = "an I/O scheduler other than none or mq-deadline spends CPU on every request "
				    "that a fast SSD does not need";
	static const char why_r[] = "buffered sequential reads ask the disk for read_ahead_kb at a time; too little "
				    "and a cold buffered read waits on small I/Os";
	static const char why_n[] = "nr_requests caps the requests queued to the device: below the engine's "
				    "threads x queue depth, requests wait in the kernel";
	static const char why_m[] = "the kernel splits each I/O larger than max_sectors_kb; below what the hardware "
				    "takes, a 4 MiB read becomes many";
	char q[PATH_MAX], sched[256], ra[32], nr[32], ms[32], mh[32], rot[8] = "0", v[600], fix[1024], *sel;
	const char *rq;
	long n;

	if (!d->disk[0]) {
		const char *what = !sl__fs_is_local(d->path) ? "remote storage" : d->fstype[0] ? d->fstype : "unknown";

		sl_emit(d, "scheduler", SLUICE_CHECK_OK, why_s, "no block device (%s)", what);
		return;
	}
	snprintf(q, sizeof(q), "%s/queue", d->disk + strlen(d->root));
	rq = q;
	sl_rd(d, rot, sizeof(rot), "%s/rotational", rq);
	if (!sl_rd(d, sched, sizeof(sched), "%s/scheduler", rq)) {
		char cur[64] = "";

		if ((sel = strchr(sched, '[')))
			snprintf(cur, sizeof(cur), "%.*s", (int)strcspn(sel + 1, "]"), sel + 1);
		else
			snprintf(cur, sizeof(cur), "%.63s", sched);
		snprintf(v, sizeof(v), "%s: %s (%s)", d->disk_name, cur, rot[0] == '1' ? "rotational" : "solid state");
		snprintf(fix, sizeof(fix), "echo %s | sudo tee /sys/block/%s/queue/scheduler (persist with a udev rule)",
			 rot[0] == '1' ? "mq-deadline" : "none", d->disk_name);
		sl_emit_fix(d, "scheduler",
			    !strcmp(cur, "none") || !strcmp(cur, "mq-deadline") || !strcmp(cur, "noop") ||
					    (rot[0] == '1' && !strcmp(cur, "bfq"))
				    ? SLUICE_CHECK_OK
				    : SLUICE_CHECK_WARN,
			    why_s, fix, v);
	}
	if (!sl_rd(d, ra, sizeof(ra), "%s/read_ahead_kb", rq)) {
		n = strtol(ra, NULL, 10);
		snprintf(v, sizeof(v), "%s: %ld KiB", d->disk_name, n);
		snprintf(fix, sizeof(fix), "echo 1024 | sudo tee /sys/block/%s/queue/read_ahead_kb (or blockdev --setra 2048 /dev/%s)",
			 d->disk_name, d->disk_name);
		sl_emit_fix(d, "read_ahead_kb", n >= 128 ? SLUICE_CHECK_OK : SLUICE_CHECK_WARN, why_r, fix, v);
	}
	if (!sl_rd(d, nr, sizeof(nr), "%s/nr_requests", rq)) {
		n = strtol(nr, NULL, 10);
		snprintf(v, sizeof(v), "%s: %ld", d->disk_name, n);
		snprintf(fix, sizeof(fix), "echo 256 | sudo tee /sys/block/%s/queue/nr_requests", d->disk_name);
		sl_emit_fix(d, "nr_requests", n >= 64 ? SLUICE_CHECK_OK : SLUICE_CHECK_WARN, why_n, fix, v);
	}
	if (!sl_rd(d, ms, sizeof(ms), "%s/max_sectors_kb", rq)) {
		long hw = sl_rd(d, mh, sizeof(mh), "%s/max_hw_sectors_kb", rq) ? 0 : strtol(mh, NULL, 10);
		long want = hw && hw < 4096 ? hw : 4096;

		n = strtol(ms, NULL, 10);
		snprintf(v, sizeof(v), "%s: %ld KiB (hardware %ld KiB)", d->disk_name, n, hw);
		snprintf(fix, sizeof(fix), "echo %ld | sudo tee /sys/block/%s/queue/max_sectors_kb", want, d->disk_name);
		sl_emit_fix(d, "max_sectors_kb", n >= want || n >= 1024 ? SLUICE_CHECK_OK : SLUICE_CHECK_WARN, why_m, fix, v);
	}
}

static void sl_check_hugepages(struct sl_dr *d)
{
	static const char why[] = "pinning gigabytes of staging memory in 4 KiB pages takes longer and fills the "
				  "IOMMU's and CPU's translation caches; huge pages cut both";
	char thp[128], mi[8192] = "", v[256], *sel;
	const char *h;
	long total = 0;

	if (sl_rd(d, thp, sizeof(thp), "/sys/kernel/mm/transparent_hugepage/enabled")) {
		sl_emit(d, "hugepages", SLUICE_CHECK_OK, why, "transparent huge pages not reported");
		return;
	}
	if (!sl_rd(d, mi, sizeof(mi), "/proc/meminfo") && (h = strstr(mi, "HugePages_Total:")))
		total = strtol(h + 16, NULL, 10);
	sel = strchr(thp, '[');
	snprintf(v, sizeof(v), "transparent %.*s; %ld reserved huge pages", sel ? (int)strcspn(sel + 1, "]") : 0,
		 sel ? sel + 1 : "", total);
	sl_emit_fix(d, "hugepages", sel && !strncmp(sel + 1, "never", 5) && !total ? SLUICE_CHECK_WARN : SLUICE_CHECK_OK,
		    why, "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled", v);
}

static void sl_check_governor(struct sl_dr *d)
{
	static const char why[] = "a core that clocks down between I/O completions adds latency to each; a "
				  "performance governor keeps the submitting threads fast";
	char p[PATH_MAX], g[64], first[64] = "", v[256];
	unsigned cpus = 0, perf = 0;
	struct dirent *e;
	DIR *dir;

	snprintf(p, sizeof(p), "%s/sys/devices/system/cpu", d->root);
	if ((dir = opendir(p))) {
		while ((e = readdir(dir))) {
			if (strncmp(e->d_name, "cpu", 3) || e->d_name[3] < '0' || e->d_name[3] > '9' ||
			    sl_rd(d, g, sizeof(g), "/sys/devices/system/cpu/%s/cpufreq/scaling_governor", e->d_name))
				continue;
			cpus++;
			perf += !strcmp(g, "performance");
			if (strcmp(g, "performance") && !first[0])
				snprintf(first, sizeof(first), "%s", g);
		}
		closedir(dir);
	}
	if (!cpus) {
		sl_emit(d, "cpu_governor", SLUICE_CHECK_OK, why, "not exposed (a virtual machine, or the firmware governs)");
		return;
	}
	snprintf(v, sizeof(v), "%u of %u CPUs on performance%s%s", perf, cpus, first[0] ? ", others " : "", first);
	sl_emit_fix(d, "cpu_governor", perf == cpus ? SLUICE_CHECK_OK : SLUICE_CHECK_WARN, why,
		    "sudo cpupower frequency-set -g performance", v);
}

int sluice_doctor(const char *path, sluice_check_fn fn, void *arg)
{
	struct sl_dr *d;
	struct sluice_config *cfg;
	const char *root = sl__sysroot();
	int rc;

	if (!fn)
		return sl__err(-EINVAL, "sluice_doctor: no callback");
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->root = root;
	d->path = path && *path ? path : ".";
	sluice_url_redact(d->path, d->shown, sizeof(d->shown));
	d->fn = fn;
	d->arg = arg;
	rc = sluice_config_new(&cfg);
	if (rc) {
		free(d);
		return rc;
	}
	d->pool = cfg->buffer_pool_size ? cfg->buffer_pool_size
					: (uint64_t)cfg->threads * cfg->queue_depth * cfg->max_transfer_size;
	d->threads = cfg->threads;
	d->ring_entries = cfg->queue_depth < 8 ? 8 : cfg->queue_depth * 2;
	sluice_config_free(cfg);
	sl_find_gpus(d);
	sl_find_disk(d);
	sl_check_gpu(d);
	sl_check_gds(d);
	sl_check_pcie(d);
	sl_check_fs(d); /* before numa and the block device: it learns the file system type */
	sl_check_storage(d);
	sl_check_numa(d);
	sl_check_iommu(d);
	sl_check_uring(d);
	sl_check_memlock(d);
	sl_check_cgroup(d);
	sl_check_block(d);
	sl_check_hugepages(d);
	sl_check_governor(d);
	rc = d->stop;
	free(d);
	return rc;
}
