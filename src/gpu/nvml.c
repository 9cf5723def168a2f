/*
 * The NVML shim (libnvidia-ml.so.1, loaded at run time, never linked) for
 * sluice_gpu_sample: utilisation, memory and PCIe throughput per GPU, as
 * `sluice top` shows them.  Our own declarations of the few types used.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"

typedef int sl_nvmlReturn;     /* 0: NVML_SUCCESS */
typedef struct sl_nvmlDevice *sl_nvmlDevice;
struct sl_nvmlUtilization {
	unsigned gpu, memory;  /* percent of the last sample period */
};
struct sl_nvmlMemory {
	unsigned long long total, free, used;
};
enum { SL_NVML_PCIE_TX = 0, SL_NVML_PCIE_RX = 1 }; /* nvmlPcieUtilCounter_t: from / into the GPU */

static struct {
	sl_nvmlReturn (*Init)(void);
	sl_nvmlReturn (*DeviceGetCount)(unsigned *);
	sl_nvmlReturn (*DeviceGetHandleByIndex)(unsigned, sl_nvmlDevice *);
	sl_nvmlReturn (*DeviceGetName)(sl_nvmlDevice, char *, unsigned);
	sl_nvmlReturn (*DeviceGetUtilizationRates)(sl_nvmlDevice, struct sl_nvmlUtilization *);
	sl_nvmlReturn (*DeviceGetMemoryInfo)(sl_nvmlDevice, struct sl_nvmlMemory *);
	sl_nvmlReturn (*DeviceGetPcieThroughput)(sl_nvmlDevice, int, unsigned *);
	const char *(*ErrorString)(sl_nvmlReturn);
} sl_nv;
static int sl_nv_ok;
static char sl_nv_why[256] = "NVML not loaded";
static pthread_once_t sl_nv_once = PTHREAD_ONCE_INIT;

static void sl_nvml_load(void)
{
	const struct sl__sym syms[] = {
		{ (void **)&sl_nv.Init, "nvmlInit_v2" },
		{ (void **)&sl_nv.DeviceGetCount, "nvmlDeviceGetCount_v2" },
		{ (void **)&sl_nv.DeviceGetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2" },
		{ (void **)&sl_nv.DeviceGetName, "nvmlDeviceGetName" },
		{ (void **)&sl_nv.DeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates" },
		{ (void **)&sl_nv.DeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo" },
		{ (void **)&sl_nv.DeviceGetPcieThroughput, "nvmlDeviceGetPcieThroughput" },
		{ (void **)&sl_nv.ErrorString, "nvmlErrorString" },
	};
	sl_nvmlReturn r;

	if (!sl__dl_load("libnvidia-ml.so.1", syms, sizeof(syms) / sizeof(syms[0]), NULL, "driver too old", sl_nv_why,
			 sizeof(sl_nv_why)))
		return;
	if ((r = sl_nv.Init())) {
		snprintf(sl_nv_why, sizeof(sl_nv_why), "nvmlInit: %s (%d)", sl_nv.ErrorString(r), r);
		return;
	}
	sl_nv_ok = 1;
}

int sluice_gpu_sample(struct sluice_gpu_sample *out, unsigned cap)
{
	unsigned n = 0;
	sl_nvmlReturn r;

	pthread_once(&sl_nv_once, sl_nvml_load);
	if (!sl_nv_ok)
		return sl__err(-ENODEV, "%s", sl_nv_why);
	if ((r = sl_nv.DeviceGetCount(&n)))
		return sl__err(-ENODEV, "nvmlDeviceGetCount: %s (%d)", sl_nv.ErrorString(r), r);
	for (unsigned i = 0; i < n && i < cap; i++) {
		struct sluice_gpu_sample *s = &out[i];
		struct sl_nvmlUtilization u;
		struct sl_nvmlMemory m;
		sl_nvmlDevice d;
		unsigned rx, tx;

		memset(s, 0, sizeof(*s));
		s->index = i;
		s->util_pct = s->mem_util_pct = -1;
		s->pcie_rx_mb_s = s->pcie_tx_mb_s = -1;
		if (sl_nv.DeviceGetHandleByIndex(i, &d))
			continue;
		sl_nv.DeviceGetName(d, s->name, sizeof(s->name));
		if (!sl_nv.DeviceGetUtilizationRates(d, &u))
			s->util_pct = (int)u.gpu, s->mem_util_pct = (int)u.memory;
		if (!sl_nv.DeviceGetMemoryInfo(d, &m))
			s->mem_used = m.used, s->mem_total = m.total;
		/* KB/s over NVML's 20 ms window; each call waits that long. */
		if (!sl_nv.DeviceGetPcieThroughput(d, SL_NVML_PCIE_RX, &rx) && !sl_nv.DeviceGetPcieThroughput(d, SL_NVML_PCIE_TX, &tx))
			s->pcie_rx_mb_s = rx * 1024.0 / 1e6, s->pcie_tx_mb_s = tx * 1024.0 / 1e6;
	}
	return (int)n;
}
