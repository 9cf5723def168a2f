/*
 * xfer: the public transfer calls: files and their reads and writes
 * (file.c), async transfers and futures (async.c), one read for many
 * buffers (bcast.c), the object client (object.c: bucket and key apart, credentials of its own), and
 * model checkpoints (ckpt.c: its readers' table and one batched load).
 * Each keeps its own state; the pipeline under them is engine/.  Depends on
 * engine/, remote/ (the object client's connection) and format/ (the
 * safetensors header's parser).
 */
#ifndef SL_XFER_H
#define SL_XFER_H

#include "engine/engine.h"
#include "remote/remote.h"

/*
 * file.c: sluice_file_open with arg, the store's option for this open
 * (an S3 client for s3:// paths; NULL: the engine's own); a destination
 * of a store that writes files whole (objects) written so, through arg,
 * its report filled.
 */
SL_HIDDEN int sl__file_open(struct sluice_file **out, struct sluice_engine *eng, void *arg,
			    const char *path, int flags);
SL_HIDDEN ssize_t sl__write_whole(struct sluice_engine *eng, void *arg, const char *path,
				  const void *src, size_t len, struct sluice_xfer_report *rep);

/*
 * async.c: a future whose work is fn(arg, rep) on a thread of its own
 * (the object client's async calls); cb (or NULL) is called on that thread
 * with the result once fn returns, before waiters wake.  free_arg(arg) at
 * sluice_future_free (or at once if the thread cannot start).
 */
SL_HIDDEN int sl__future_call(struct sluice_future **out, ssize_t (*fn)(void *arg, struct sluice_xfer_report *rep),
			      void *arg, void (*free_arg)(void *arg), void (*cb)(ssize_t result, void *user),
			      void *user);

#endif
