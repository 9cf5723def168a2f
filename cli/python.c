/*
 * Starting Python, for the commands whose work is Python's (journey,
 * diagnose, pack --from-parquet and --from-hf): one way for all of them, so
 * that none imports a module from the directory the user runs it in.
 *
 * Python puts the current directory first on its module path for -m and -c
 * (sys.path[0]), and for each empty or relative entry of PYTHONPATH (made
 * absolute before site runs: a sitecustomize.py there runs at start-up).  A
 * json.py, numpy.py or tempfile.py beside the user's data would then run in
 * sluice's place.  Python's own switches cannot say this for every Python
 * sluice supports (3.9 on): -I also drops PYTHONPATH and the user's site
 * packages (where numpy may be), and -P is 3.11's.  So the Python started
 *   - has PYTHONPATH without its empty and relative entries, nor any naming
 *     the current directory (the package directory added here stays);
 *   - runs BOOT (with -c): it drops sys.path[0] ('' for -c) before it imports
 *     anything, and runs the program as `python -m MODULE` or `python FILE`
 *     would;
 *   - where what the program starts is sluice's too (journey's DataLoader
 *     workers), the children keep that PYTHONPATH and get PYTHONSAFEPATH=1:
 *     multiprocessing's spawn and forkserver children (3.14's default) start
 *     with -c, and would put the current directory first (3.9 and 3.10 ignore
 *     it, and fork by default);
 *   - where it is the user's (the script `sluice diagnose` runs), BOOT puts
 *     the user's PYTHONPATH back for it, as it was.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/*
 * argv: -c BOOT MAIN PYTHONPATH SAFE WHY ARGS...  PYTHONPATH is "=VALUE" to set it, "" to unset it; SAFE "1" sets
 * PYTHONSAFEPATH=1 for the children; WHY is the sentence's start for a package this Python lacks (a MAIN of a
 * package, sluice.diagnose, has its package imported first: a python3 without numpy is that sentence, not a
 * traceback).  It MUST run on Python 3.9 and import nothing before sys.path[0] is gone.
 */
static const char BOOT[] =
	"import sys\n"
	"if sys.path and sys.path[0] == '':\n"
	"    del sys.path[0]\n"
	"import os, runpy\n"
	"m, pp, safe, why = sys.argv[1:5]\n"
	"if pp:\n"
	"    os.environ['PYTHONPATH'] = pp[1:]\n"
	"else:\n"
	"    os.environ.pop('PYTHONPATH', None)\n"
	"if safe == '1':\n"
	"    os.environ.setdefault('PYTHONSAFEPATH', '1')\n"
	"sys.argv[:] = [m] + sys.argv[5:]\n"
	"if m.endswith('.py'):\n"
	"    sys.path.insert(0, os.path.dirname(os.path.abspath(m)))\n"
	"    runpy.run_path(m, run_name='__main__')\n"
	"else:\n"
	"    try:\n"
	"        __import__(m.partition('.')[0])\n"
	"    except ModuleNotFoundError as e:\n"
	"        sys.exit(why % (sys.executable, e.name))\n"
	"    runpy.run_module(m, run_name='__main__', alter_sys=True)\n";

/* This program's path (/proc/self/exe: absolute, links resolved) into exe; 0, or -1 with the error printed. */
static int self_exe(const char *cmd, char *exe, size_t cap)
{
	ssize_t n = readlink("/proc/self/exe", exe, cap - 1);

	if (n <= 0 || (size_t)n >= cap - 1) {
		cli_fail(cmd, "cannot find its own program (/proc/self/exe)");
		return -1;
	}
	exe[n] = 0;
	return 0;
}

int cli_self_dir(const char *cmd, char *dir, size_t cap)
{
	if (self_exe(cmd, dir, cap))
		return -1;
	*strrchr(dir, '/') = 0;
	return 0;
}

/* Whether an entry of PYTHONPATH stays: absolute, and not the current directory (by device and inode). */
static int path_entry_kept(const char *e, size_t len, const struct stat *cwd)
{
	char p[PATH_MAX];
	struct stat st;

	if (!len || e[0] != '/')
		return 0;
	if (len >= sizeof(p) || !cwd)
		return 1;
	memcpy(p, e, len);
	p[len] = 0;
	return stat(p, &st) || st.st_dev != cwd->st_dev || st.st_ino != cwd->st_ino;
}

/* PYTHONPATH's entries that stay, in their order, into out (at least strlen(in) + 1 bytes). */
static void path_clean(const char *in, char *out)
{
	struct stat cwd;
	int have_cwd = !stat(".", &cwd);
	char *o = out;

	for (const char *e = in;; e++) {
		const char *end = strchr(e, ':');
		size_t len = end ? (size_t)(end - e) : strlen(e);

		if (path_entry_kept(e, len, have_cwd ? &cwd : NULL)) {
			if (o > out)
				*o++ = ':';
			memcpy(o, e, len);
			o += len;
		}
		if (!end)
			break;
		e = end;
	}
	*o = 0;
}

/*
 * "sluice's" + ":" + "user's" (or the other way round), either may be empty; malloc'd, NULL when out of
 * memory.
 */
static char *path_join(const char *first, const char *second)
{
	size_t a = strlen(first), b = strlen(second);
	char *p = malloc(a + b + 2);

	if (p)
		snprintf(p, a + b + 2, "%s%s%s", first, a && b ? ":" : "", second);
	return p;
}

int cli_python_exec(const char *cmd, const char *py, const char *main, char *const args[], const char *needs,
		    int own_children)
{
	char exe[PATH_MAX], dir[PATH_MAX], p[PATH_MAX + 64], here[PATH_MAX + 64];
	const char *set = getenv("PYTHONPATH");
	char *old = strdup(set ? set : ""), *clean = old ? malloc(strlen(old) + 1) : NULL, *full = NULL, *run = NULL;
	char *restore = NULL, **argv = NULL, why[512];
	size_t n = 0;
	int rc = 1;

	/* %s: the Python's path and the module it lacks, put in by BOOT ('%' of the rest doubled) */
	snprintf(why, sizeof(why), "sluice %s: %%s has no module named '%%s': sluice %s runs in %s, which needs %s",
		 cmd, cmd, py && *py ? "the Python the command names" : "SLUICE_PYTHON (default python3)", needs);
	if (!py || !*py)
		py = sluice_setting("SLUICE_PYTHON");
	if (!py || !*py)
		py = "python3";
	while (args[n])
		n++;
	if (!clean || !(argv = calloc(n + 8, sizeof(*argv))))
		goto oom;
	if (self_exe(cmd, exe, sizeof(exe)))
		goto out;
	memcpy(dir, exe, sizeof(dir));
	*strrchr(dir, '/') = 0;
	setenv("SLUICE_BIN", exe, 0);
	snprintf(p, sizeof(p), "%s/libsluice.so", dir);
	if (!access(p, R_OK))
		setenv("SLUICE_LIB", p, 0);
	path_clean(old, clean);
	/*
	 * From a build tree, the package beside it first; from a wheel's package (sluice/_bin/sluice run by its own
	 * path, not through the entry point), the folder that package is in, last: what the user's PYTHONPATH names
	 * comes first.  Otherwise the one pip put on the Python's path.
	 */
	here[0] = 0;
	snprintf(p, sizeof(p), "%s/../python/sluice/__init__.py", dir);
	if (!access(p, R_OK)) {
		snprintf(here, sizeof(here), "%s/../python", dir);
		full = path_join(here, old);
		run = path_join(here, clean);
	} else {
		snprintf(p, sizeof(p), "%s/../__init__.py", dir);
		if (!access(p, R_OK))
			snprintf(here, sizeof(here), "%s/../..", dir);
		full = path_join(old, here);
		run = path_join(clean, here);
	}
	if (!full || !run || !(restore = malloc(strlen(full) + 2)))
		goto oom;
	/* The user's script gets the user's PYTHONPATH back; sluice's own children keep the one given here. */
	snprintf(restore, strlen(full) + 2, "=%s", own_children ? run : full);
	if (*run)
		setenv("PYTHONPATH", run, 1);
	else
		unsetenv("PYTHONPATH");
	argv[0] = (char *)py;
	argv[1] = "-c";
	argv[2] = (char *)BOOT;
	argv[3] = (char *)main;
	argv[4] = own_children ? (*run ? restore : "") : set || *full ? restore : "";
	argv[5] = own_children ? "1" : "0";
	argv[6] = why;
	memcpy(argv + 7, args, n * sizeof(*argv));
	execvp(py, argv);
	rc = cli_fail(cmd, "cannot run %s (set SLUICE_PYTHON to a python3 with %s): %s", py, needs, strerror(errno));
	goto out;
oom:
	cli_fail(cmd, "out of memory");
out:
	free(argv);
	free(restore);
	free(run);
	free(full);
	free(clean);
	free(old);
	return rc;
}
