/*
 * sluice diagnose: runs a training script unchanged and reports where its
 * pipeline loses time.  The work is Python's (the package's
 * sluice/diagnose.py: a hook in the script's interpreter watches its
 * DataLoaders, then the HTML, JSON and trace); this runs it with
 * SLUICE_PYTHON (default python3), pointed at this build's library and
 * package when it runs from a build tree.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cmd_diagnose(int argc, char **argv)
{
	char dir[PATH_MAX];
	char **args = calloc((size_t)argc + 4, sizeof(*args));
	const char *py;

	/* The help needs no Python: the package's first import loads numpy and the library. */
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: sluice diagnose [--html R.html] [--json R.json] [--trace T.json]\n"
			       "                       [--sweep-workers 0,4,8 [--steps N]] -- python train.py ARGS\n\n"
			       "Runs a training script unchanged (a hook in its Python watches every torch DataLoader and\n"
			       "sluice.Loader it iterates) and reports where its pipeline loses time: a verdict with its\n"
			       "evidence and fix, and charts of the run.\n\n"
			       "  --html R.html         the report (default ./sluice-diagnose.html)\n"
			       "  --json R.json         the figures as JSON too\n"
			       "  --trace T.json        a Chrome trace of each loader's waits and steps\n"
			       "  --sweep-workers LIST  DataLoader worker counts to try, as 0,4,8,16: the script's first\n"
			       "                        --steps batches again at each, beside the first run's prediction\n"
			       "  --steps N             batches each --sweep-workers run takes (default 50)\n\n"
			       "The script's exit status is the command's.  SLUICE_PYTHON names the Python to run it\n"
			       "with (default python3).\n");
			return 0;
		}
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
