/*
 * sluice journey: experiments that follow data from storage to the GPU
 * on this machine (the loader against PyTorch's, pinned against pageable
 * copies, packing against padding, and more), as an HTML report.  The experiments are Python, a tool beside the package
 * (tools/journey/journey.py: they drive sluice, numpy and, where installed, the peers); this runs it with
 * SLUICE_PYTHON (default python3), pointing it at this build's library and
 * package when it runs from a build tree (cli_python_exec: nothing is imported
 * from the current directory).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/*
 * journey.py beside this program: in the source tree (build/../tools), installed (bin/../share/sluice), or in
 * the Python package (sluice/_bin/../journey).
 */
static int journey_find(const char *dir, char *p, size_t cap)
{
	static const char *const where[] = { "%s/../tools/journey/journey.py", "%s/../share/sluice/journey/journey.py",
					     "%s/../journey/journey.py" };

	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++) {
		snprintf(p, cap, where[i], dir);
		if (!access(p, R_OK))
			return 0;
	}
	return -1;
}

int cmd_journey(int argc, char **argv)
{
	char dir[PATH_MAX], p[PATH_MAX + 64];

	(void)argc;
	if (cli_self_dir("journey", dir, sizeof(dir)))
		return 1;
	if (journey_find(dir, p, sizeof(p)))
		return cli_fail("journey", "its experiments (tools/journey/journey.py) are neither in %s/../tools nor in "
				"%s/../share/sluice", dir, dir);
	/* Run as a file: the package (and numpy) load after the arguments are read. */
	return cli_python_exec("journey", NULL, p, argv + 1, "numpy", 1);
}
