/*
 * sluice diagnose: runs a training script unchanged and reports where its
 * pipeline loses time.  The work is Python's (the package's
 * sluice/diagnose.py: a hook in the script's interpreter watches its
 * DataLoaders, then the HTML, JSON and trace); this runs it in the Python the
 * script's command names (its first word, or the interpreter on the #! line
 * of a launcher such as torchrun), else SLUICE_PYTHON (default python3), by
 * cli_python_exec: pointed at this build's library and package when it runs
 * from a build tree, and nothing imported from the current directory.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* python, python3, python3.12: a Python by its name. */
static int is_python(const char *path)
{
	const char *b = strrchr(path, '/');

	b = b ? b + 1 : path;
	if (strncmp(b, "python", 6))
		return 0;
	return b[6 + strspn(b + 6, "0123456789.")] == 0;
}

/* prog as the command would find it (execvp's rule: on PATH without a slash) into path: 0, or -1. */
static int find_prog(const char *prog, char *path, size_t cap)
{
	const char *d = getenv("PATH");

	if (strchr(prog, '/')) {
		snprintf(path, cap, "%s", prog);
		return 0;
	}
	for (d = d ? d : "/usr/local/bin:/usr/bin:/bin";;) {
		size_t len = strcspn(d, ":");

		snprintf(path, cap, "%.*s%s%s", (int)len, d, len ? "/" : "", prog);
		if (!access(path, X_OK))
			return 0;
		if (!d[len])
			return -1;
		d += len + 1;
	}
}

/*
 * The interpreter on prog's #! line where it is a Python (itself, or through env), into py: 1, or 0 when prog
 * is not a script of a Python's.  Only a regular file is read (a FIFO named there would block), only its first
 * line, up to 255 bytes.
 */
static int shebang_python(const char *prog, char *py, size_t cap)
{
	char path[PATH_MAX], line[256], *tok[4] = { 0 }, *save = NULL, *nl;
	struct stat st;
	ssize_t got;
	int fd, n = 0;

	if (find_prog(prog, path, sizeof(path)) || (fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
		return 0;
	got = !fstat(fd, &st) && S_ISREG(st.st_mode) ? read(fd, line, sizeof(line) - 1) : -1;
	close(fd);
	if (got < 3 || line[0] != '#' || line[1] != '!')
		return 0;
	line[got] = 0;
	if (!(nl = strchr(line, '\n')))
		return 0; /* a first line longer than the kernel's own limit: not a script the command can run */
	*nl = 0;
	for (char *t = strtok_r(line + 2, " \t", &save); t && n < 4; t = strtok_r(NULL, " \t", &save))
		tok[n++] = t;
	if (!n)
		return 0;
	if (!strcmp(strrchr(tok[0], '/') ? strrchr(tok[0], '/') + 1 : tok[0], "env")) {
		/* #!/usr/bin/env python3, or env -S python3 -u */
		int i = 1;

		while (i < n && tok[i][0] == '-')
			i++;
		if (i == n || !is_python(tok[i]))
			return 0;
		snprintf(py, cap, "%s", tok[i]);
		return 1;
	}
	if (!is_python(tok[0]))
		return 0;
	snprintf(py, cap, "%s", tok[0]);
	return 1;
}

int cmd_diagnose(int argc, char **argv)
{
	char named[PATH_MAX];
	const char *py = NULL;
	int k;

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
			       "The script's exit status is the command's (a signal that ends it, too), and a signal sent to\n"
			       "sluice is passed on to it.  One report a run, the training process's, however many Pythons\n"
			       "the script starts (DataLoader workers, launchers such as torchrun).  sluice runs in the\n"
			       "Python the command names (python3, /venv/bin/python, a launcher's #! line), else\n"
			       "SLUICE_PYTHON (default python3).\n");
			return 0;
		}
	for (k = 1; k < argc && strcmp(argv[k], "--"); k++)
		;
	/*
	 * The driver runs in the script's own Python: the hook runs there anyway, so whatever sluice needs is there
	 * (a venv's python named by its path need not be the first python3 on PATH).
	 */
	if (k + 1 < argc)
		py = is_python(argv[k + 1]) ? argv[k + 1] : shebang_python(argv[k + 1], named, sizeof(named)) ? named : NULL;
	/* What the driver starts is the user's script: its environment stays the user's. */
	return cli_python_exec("diagnose", py, "sluice.diagnose", argv + 1, "sluice and numpy", 0);
}
