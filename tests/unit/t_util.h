/* Helpers shared by the test programs. */
#ifndef T_UTIL_H
#define T_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sluice.h"

#define T_SKIP 77

extern int t_failures;

#define T_CHECK(cond)                                                                   \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "%s:%d: CHECK failed: %s (detail: %s)\n", __FILE__, \
				__LINE__, #cond, sluice_last_error_detail());           \
			t_failures++;                                                   \
		}                                                                       \
	} while (0)

/* A fresh directory for this test under $SLUICE_TEST_DIR (or /tmp). */
const char *t_dir(const char *name);
/* Fills n bytes with a pseudo-random stream from seed. */
void t_fill(void *p, size_t n, uint64_t seed);
/* Writes n pseudo-random bytes to path; returns a malloc'd copy of them. */
char *t_make_file(const char *path, size_t n, uint64_t seed);
/* Reads a whole file; returns malloc'd bytes and sets *n. */
char *t_slurp(const char *path, size_t *n);
/* Opens an engine from the environment; exits 77 if SLUICE_BACKEND is unusable here. */
struct sluice_engine *t_engine(void);
/*
 * One shuffled epoch of a host loader over ds, batches of B, windows of
 * window_bytes: every record arrives, each field as sluice_dataset_read()
 * gives it.
 */
void t_loader_epoch(struct sluice_dataset *ds, uint32_t B, uint64_t window_bytes);
int t_done(const char *name);

#endif
