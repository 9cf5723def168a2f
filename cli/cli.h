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

/*
 * --json: main.c sets cli_json_mode where a command that prints JSON on stdout was given --json.  Then every
 * failure reported through cli_fail, cli_failed or cli_error is also one JSON object on stdout,
 *     {"error":{"command","status","code","name","message","detail","text"}}
 * (status: the exit status; code: sluice's or -errno, name: its name, message: sluice_strerror's, detail: the
 * library's detail or the message, text: the stderr line), so a caller that parses stdout always gets JSON.
 * A command that prints its object in pieces (a list as it goes) calls cli_json_open(inner) once its opening is
 * out, inner closing what is open inside it ("]" in a list, "" none): an error then closes that and lands in the
 * command's object as its "error" key; cli_json_close() ends the object (inner, then "}").  After a whole
 * document nothing more is printed.  main.c passes each command's exit status through cli_json_end(), which
 * says "failed" in JSON for a failure no helper reported.
 */
extern int cli_json_mode;
void cli_json_open(const char *inner);
void cli_json_close(void);
int cli_json_end(const char *cmd, int status);
/* Prints "sluice <cmd>: message" to stderr (and JSON, above) and returns 2 (usage/input error). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As cli_fail, with the exit status and the error's code (sluice's or -errno) given. */
int cli_failed(const char *cmd, int status, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Parses a byte size option; on error prints a message naming opt. */
int cli_size(const char *cmd, const char *opt, const char *v, uint64_t *out);
/* Parses an unsigned integer in [lo, hi]; on error prints a message naming opt. */
int cli_uint(const char *cmd, const char *opt, const char *v, unsigned lo, unsigned hi, unsigned *out);
/* Prints sluice's error with its detail (and JSON, above); returns 1. */
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
/*
 * --cold: each of the n files out of the page cache (sluice_page_cache_evict: those files alone, no root
 * needed).  1 when every one went, else 0 with into why (cap bytes) the first that stayed, how much and why; a
 * file that is not there (a write's, not made yet) is nothing to evict.  An error (a file unreadable) is why too.
 */
int cli_evict(const char *const *paths, unsigned n, char *why, size_t cap);
/* Writes s as a JSON string literal. */
void cli_json_str(const char *s);
/* 1 where s is one JSON value (RFC 8259, nested at most 64 deep), and nothing else but white space. */
int cli_json_valid(const char *s);
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
