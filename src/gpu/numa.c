/*
 * Where a GPU sits (gpu.h): the NUMA node sysfs gives its PCI device, and
 * that node's CPUs, so the engine's workers run there and the pinned slots
 * they touch first are allocated there: staging memory on the GPU's
 * socket, so its copies to the GPU do not cross the link between sockets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"

/* rel under SLUICE_SYSROOT into buf (trailing newline cut); 0 or -errno. */
static int sl_sysfs(const char *rel, char *buf, size_t cap)
{
	return sl__sys_read(buf, cap, "%s", rel);
}

void sl__numa_of_pci(const char *pci, int *node, cpu_set_t *cpus)
{
	char rel[128], v[4096], *p, *end;
	long nd;

	*node = -1;
	CPU_ZERO(cpus);
	if (!pci || !*pci)
		return;
	snprintf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/numa_node", pci);
	if (sl_sysfs(rel, v, sizeof(v)) || (nd = strtol(v, &end, 10)) < 0 || end == v || nd > 4095)
		return;
	snprintf(rel, sizeof(rel), "/sys/devices/system/node/node%ld/cpulist", nd);
	if (sl_sysfs(rel, v, sizeof(v)))
		return;
	/* "0-15,32-47": ranges and single CPUs, comma separated. */
	for (p = v; *p;) {
		long a = strtol(p, &end, 10), b = a;

		if (end == p || a < 0)
			goto bad;
		p = end;
		if (*p == '-') {
			b = strtol(p + 1, &end, 10);
			if (end == p + 1 || b < a)
				goto bad;
			p = end;
		}
		for (long c = a; c <= b && c < CPU_SETSIZE; c++)
			CPU_SET((int)c, cpus);
		if (*p == ',')
			p++;
		else if (*p)
			goto bad;
	}
	if (CPU_COUNT(cpus))
		*node = (int)nd;
	return;
bad:
	CPU_ZERO(cpus);
}
