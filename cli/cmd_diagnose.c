/*
 * sluice diagnose: runs a training script unchanged and reports where its
 * pipeline loses time.  The work is Python's (the package's
 * sluice/diagnose.py: a hook in the script's interpreter watches its
 * DataLoaders, then the HTML, JSON and trace); this runs it with
 * SLUICE_PYTHON (default python3), pointed at this build's library and
 * package when it runs from a build tree.
 */
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"

int cmd_diagnose(int argc, char **argv)
{
	char dir[PATH_MAX];
	char **args = calloc((size_t)argc + 4, sizeof(*args));
	const char *py;

	if (!args || !(py = cli_python_env("diagnose", dir, sizeof(dir))))
		return 1;
	args[0] = (char *)py;
	args[1] = "-m";
	args[2] = "sluice.diagnose";
	for (int i = 1; i < argc; i++)
		args[i + 2] = argv[i];
	execvp(args[0], args);
	return cli_fail("diagnose", "cannot run %s (set SLUICE_PYTHON to a python3 with sluice and numpy): %m", args[0]);
}
