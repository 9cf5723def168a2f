/* The sluice command: the subcommands (cmd_<name>.c) and their shared helpers (util.c, python.c). */
#ifndef CLI_H
#define CLI_H

#include <stdint.h>

#include "sluice.h"

int cmd_bench(int argc, char **argv);
int cmd_checkpoint(int argc, char **argv);
int cmd_cp(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_journey(int argc, char **argv);
int cmd_load(int argc, char **argv);
int cmd_diagnose(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_top(int argc, char **argv);
int cmd_tune(int argc, char **argv);

/* Prints "sluice <cmd>: message" to stderr and returns 2 (usage/input error). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a byte size option; on error prints a message naming opt. */
int cli_size(const char *cmd, const char *opt, const char *v, uint64_t *out);
/* Parses an unsigned integer in [lo, hi]; on error prints a message naming opt. */
int cli_uint(const char *cmd, const char *opt, const char *v, unsigned lo, unsigned hi, unsigned *out);
/* Prints sluice's error with its detail. */
int cli_error(const char *cmd, const char *what, long code);
/*
 * A path or URL as messages name it (sluice_url_redact: no password, no
 * query), in one of a few static buffers reused in turn: valid for the
 * next three calls (enough for one message).  Not thread-safe.
 */
const char *cli_shown(const char *path);
/*
 * Parses "[--json] [OPT VALUE] DATASET" and opens the dataset.  opt (may be
 * NULL) names one optional valued option, whose value lands in *opt_val.
 * Returns 0 with *ds open; -1 after --help (usage printed); otherwise the
 * exit code to return (2: usage, 1: the dataset would not open).
 */
int cli_open_dataset(const char *cmd, int argc, char **argv, const char *usage, const char *opt,
		     const char **opt_val, int *json, const char **path, struct sluice_dataset **ds);
/* Writes s as a JSON string literal. */
void cli_json_str(const char *s);
/* This program's directory into dir: 0, or -1 with the error printed. */
int cli_self_dir(const char *cmd, char *dir, size_t cap);
/*
 * The one way a command starts Python (python.c): replaces this process with py (NULL: SLUICE_PYTHON, else
 * python3) running main, a module's name (run as python -m would) or a .py file's path (as python FILE would),
 * with args (NULL-terminated) as its sys.argv[1:], and SLUICE_BIN, SLUICE_LIB and PYTHONPATH set for this
 * program's build.  The current directory is never on that Python's module path.  own_children: what the
 * program starts is sluice's too (not a script of the user's), and is kept from the current directory as well.
 * Returns only on failure, the exit code, the error printed (needs: what the Python must have, for the message).
 */
int cli_python_exec(const char *cmd, const char *py, const char *main, char *const args[], const char *needs,
		    int own_children);

#endif
