/*
 * A GPU's NUMA node and CPUs from sysfs (gpu/numa.c), on faked trees under
 * SLUICE_SYSROOT: a node with its cpulist, no node (-1), a missing device,
 * and cpulists that do not parse.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu/gpu.h"
#include "t_util.h"

static char root[512];

static void put(const char *rel, const char *text)
{
	char p[1024], cmd[1100];
	FILE *f;

	snprintf(p, sizeof(p), "%s%s", root, rel);
	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\"", p);
	if (system(cmd) != 0 || !(f = fopen(p, "w")) || fputs(text, f) < 0 || fclose(f)) {
		perror(p);
		exit(1);
	}
}

int main(void)
{
	cpu_set_t s;
	int node;

	snprintf(root, sizeof(root), "%s", t_dir("numa"));
	setenv("SLUICE_SYSROOT", root, 1);
	put("/sys/bus/pci/devices/0000:17:00.0/numa_node", "1\n");
	put("/sys/devices/system/node/node1/cpulist", "2-3,6\n");
	sl__numa_of_pci("0000:17:00.0", &node, &s);
	T_CHECK(node == 1 && CPU_COUNT(&s) == 3 && CPU_ISSET(2, &s) && CPU_ISSET(3, &s) && CPU_ISSET(6, &s));

	put("/sys/bus/pci/devices/0000:18:00.0/numa_node", "-1\n"); /* one socket, or a virtual machine */
	sl__numa_of_pci("0000:18:00.0", &node, &s);
	T_CHECK(node == -1 && CPU_COUNT(&s) == 0);
	sl__numa_of_pci("0000:99:00.0", &node, &s); /* no such device */
	T_CHECK(node == -1);
	sl__numa_of_pci("", &node, &s);             /* the driver gave no bus id */
	T_CHECK(node == -1);

	static const char *const bad[] = { "3-1\n", "x\n", "1,,2\n", "\n", "4;5\n" };
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		put("/sys/devices/system/node/node1/cpulist", bad[i]);
		sl__numa_of_pci("0000:17:00.0", &node, &s);
		T_CHECK(node == -1 && CPU_COUNT(&s) == 0);
	}
	put("/sys/devices/system/node/node1/cpulist", "0-63\n");
	sl__numa_of_pci("0000:17:00.0", &node, &s);
	T_CHECK(node == 1 && CPU_COUNT(&s) == 64);
	printf("t_numa: %s\n", t_failures ? "FAIL" : "PASS");
	return t_failures ? 1 : 0;
}
