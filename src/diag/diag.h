/*
 * diag: what sluice tells about itself and the machine.  The doctor's
 * checks (doctor.c), the figures each loader publishes for `sluice top`
 * (publish.c), the process's I/O counters and their Prometheus exposition
 * (metrics.c).  Depends on core, and on store/ for the doctor's io_uring
 * probe (the engine's own, so the two cannot disagree).
 */
#ifndef SL_DIAG_H
#define SL_DIAG_H

#include "core/core.h"

/*
 * A loader's published figures: a small shared-memory file under
 * SLUICE_RUN_DIR (default /dev/shm, else $TMPDIR or /tmp), "sluice-loader.PID.ID", that `sluice
 * top` of any process reads, and this process's /metrics renders.
 * Publishing is best effort: sl__pub_open returns NULL when the file
 * cannot be made, and the other calls take NULL.
 */
struct sl__pub;
SL_HIDDEN struct sl__pub *sl__pub_open(const char *dataset);
/* Replaces the figures (a seqlock: readers never see half an update). Not thread-safe per pub. */
SL_HIDDEN void sl__pub_update(struct sl__pub *p, const struct sluice_loader_figures *f);
SL_HIDDEN void sl__pub_close(struct sl__pub *p);
/* Calls fn for each loader of this process (a consistent copy each) until fn returns nonzero. */
SL_HIDDEN int sl__pub_each(int (*fn)(const struct sluice_loader_figures *f, void *arg), void *arg);

/* The process's engine counters, for /metrics: one finished call's bytes, segments, error and time. */
SL_HIDDEN void sl__metrics_call(int write, uint64_t bytes, uint64_t ios, int err, uint64_t ns);
/* A segment's latency (storage to memory), for the latency summary. */
SL_HIDDEN void sl__metrics_segment(uint64_t ns);
/* Starts the exporter when SLUICE_METRICS_PORT is set (once per process); 0 or its error. */
SL_HIDDEN int sl__metrics_auto(void);

#endif
