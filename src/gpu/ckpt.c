/*
 * GPU process checkpoints (sluice.h): the driver's cuCheckpointProcess*
 * functions, as NVIDIA's cuda-checkpoint tool drives them, on another
 * process (or this one).  Suspend = lock (no new CUDA calls; running work
 * finishes) then checkpoint (the process's GPU memory copied to host
 * memory, its device handles released); resume = restore then unlock.  The
 * GPU memory moved is what the checkpoint freed on the GPUs, by NVML.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"

static const char *const sl_state_name[] = { "running", "locked", "checkpointed", "failed", "checkpointing",
					     "restoring" };

const char *sluice_process_state_name(int state)
{
	return state >= 0 && state < 6 ? sl_state_name[state] : "unknown";
}

static int sl_ckpt_api(const struct sl__cuda_api **out)
{
	const char *why = NULL;
	const struct sl__cuda_api *cu = sl__cuda(&why);

	if (!cu)
		return sl__err(SLUICE_ENOGPU, "GPU process checkpoints: %s", why);
	if (!cu->CheckpointProcessLock || !cu->CheckpointProcessCheckpoint || !cu->CheckpointProcessRestore ||
	    !cu->CheckpointProcessUnlock || !cu->CheckpointProcessGetState)
		return sl__err(-ENOSYS, "GPU process checkpoints: this driver's libcuda.so.1 lacks cuCheckpointProcess* "
			       "(they need driver 550 or later)");
	*out = cu;
	return 0;
}

int sluice_process_state(int pid, int *state)
{
	const struct sl__cuda_api *cu = NULL;
	int rc = sl_ckpt_api(&cu);

	if (rc)
		return rc;
	*state = -1;
	return SL_CU(cu->CheckpointProcessGetState(pid, state), "cuCheckpointProcessGetState");
}

/* GPU memory in use on every GPU, by NVML; 0 when NVML is unusable. */
static uint64_t sl_gpu_used(void)
{
	struct sluice_gpu_sample g[16];
	int n = sluice_gpu_sample(g, 16);
	uint64_t used = 0;

	for (int i = 0; i < n && i < 16; i++)
		used += g[i].mem_used;
	return used;
}

/* Runs one phase, timed; the error names the phase and the process. */
static int sl_phase(sl_CUresult (*fn)(int, void *), int pid, unsigned timeout_ms, const char *name, double *secs)
{
	uint64_t args[8] = { 0 }, t0 = sl__now_ns();
	sl_CUresult r;

	/* CUcheckpointLockArgs.timeoutMs is the low 32 bits of the first word (little-endian); 0 for the others. */
	args[0] = timeout_ms;
	r = fn(pid, args);
	*secs = (double)(sl__now_ns() - t0) / 1e9;
	if (r != SL_CUDA_SUCCESS) {
		char what[96];

		snprintf(what, sizeof(what), "%s(pid %d)", name, pid);
		return sl__cuda_err(r, what);
	}
	return 0;
}

int sluice_process_checkpoint(int pid, unsigned flags, unsigned timeout_ms, struct sluice_checkpoint_report *rep)
{
	const struct sl__cuda_api *cu = NULL;
	struct sluice_checkpoint_report mine = SLUICE_CHECKPOINT_REPORT_INIT;
	int rc = SL_REPORT_IN(rep, checkpoint_report), st = -1;

	if (rc)
		return rc;
	if (!rep)
		rep = &mine;
	rep->state = -1;
	if (pid <= 0 || !(flags & (SLUICE_CKPT_SUSPEND | SLUICE_CKPT_RESUME)) ||
	    (flags & ~(unsigned)(SLUICE_CKPT_SUSPEND | SLUICE_CKPT_RESUME)))
		return sl__err(-EINVAL, "checkpoint of pid %d: flags %#x (want SUSPEND, RESUME or both)", pid, flags);
	if ((rc = sl_ckpt_api(&cu)))
		return rc;
	if ((rc = SL_CU(cu->CheckpointProcessGetState(pid, &st), "cuCheckpointProcessGetState")))
		return sl__err(rc, "pid %d: not a CUDA process of this user's, or gone (%s)", pid, sluice_last_error_detail());
	if (flags & SLUICE_CKPT_SUSPEND) {
		uint64_t before;

		if (st != 0)
			return sl__err(-EBUSY, "pid %d is %s, not running: nothing to suspend", pid, sluice_process_state_name(st));
		before = sl_gpu_used();
		if ((rc = sl_phase(cu->CheckpointProcessLock, pid, timeout_ms, "cuCheckpointProcessLock", &rep->lock_s)))
			goto out;
		if ((rc = sl_phase(cu->CheckpointProcessCheckpoint, pid, 0, "cuCheckpointProcessCheckpoint",
				   &rep->checkpoint_s))) {
			double t;

			cu->CheckpointProcessGetState(pid, &st);
			if (st == 1) /* still locked: let it run again rather than leave it frozen */
				sl_phase(cu->CheckpointProcessUnlock, pid, 0, "cuCheckpointProcessUnlock", &t);
			goto out;
		}
		{
			uint64_t after = sl_gpu_used();

			rep->gpu_bytes = before > after ? before - after : 0;
		}
	} else if (st != 2) {
		return sl__err(-EBUSY, "pid %d is %s, not checkpointed: nothing to resume", pid, sluice_process_state_name(st));
	}
	if (flags & SLUICE_CKPT_RESUME) {
		uint64_t before = sl_gpu_used();

		if ((rc = sl_phase(cu->CheckpointProcessRestore, pid, 0, "cuCheckpointProcessRestore", &rep->restore_s)) ||
		    (rc = sl_phase(cu->CheckpointProcessUnlock, pid, 0, "cuCheckpointProcessUnlock", &rep->unlock_s)))
			goto out;
		if (!(flags & SLUICE_CKPT_SUSPEND)) {
			uint64_t after = sl_gpu_used();

			rep->gpu_bytes = after > before ? after - before : 0;
		}
	}
out:
	if (cu->CheckpointProcessGetState(pid, &st) == SL_CUDA_SUCCESS)
		rep->state = st;
	return rc;
}
