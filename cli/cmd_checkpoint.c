/* sluice checkpoint: suspend a CUDA process's GPU state to host memory and resume it (the driver's checkpoints). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define CMD "checkpoint"

static const char usage[] =
	"usage: sluice checkpoint [--json] [--suspend | --resume] [--hold S] [--timeout MS] PID\n"
	"  Locks the CUDA process PID and moves its GPU memory to host memory (--suspend), restores\n"
	"  and unlocks it (--resume), or both, --hold S seconds apart (the default: a round trip).\n"
	"  Reports each phase's time and the GPU memory moved.  --timeout: how long the lock waits\n"
	"  for the process's running GPU work, in ms (default 0: no limit).\n";

int cmd_checkpoint(int argc, char **argv)
{
	struct sluice_checkpoint_report s = SLUICE_CHECKPOINT_REPORT_INIT, r = SLUICE_CHECKPOINT_REPORT_INIT;
	unsigned flags = SLUICE_CKPT_SUSPEND | SLUICE_CKPT_RESUME, timeout = 0, pid = 0;
	double hold = 0;
	int json = 0, rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--suspend")) {
			flags = SLUICE_CKPT_SUSPEND;
		} else if (!strcmp(argv[i], "--resume")) {
			flags = SLUICE_CKPT_RESUME;
		} else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			if (cli_uint(CMD, "--timeout", argv[++i], 0, 86400000, &timeout))
				return 2;
		} else if (!strcmp(argv[i], "--hold") && i + 1 < argc) {
			char *end;

			hold = strtod(argv[++i], &end);
			if (*end || !(hold >= 0 && hold <= 86400))
				return cli_fail(CMD, "--hold '%s': want seconds from 0 to 86400", argv[i]);
		} else if (argv[i][0] == '-') {
			return cli_fail(CMD, "unknown option '%s'\n%s", argv[i], usage);
		} else if (pid) {
			return cli_fail(CMD, "one PID, not '%s' too", argv[i]);
		} else if (cli_uint(CMD, "PID", argv[i], 1, 1u << 30, &pid)) {
			return 2;
		}
	}
	if (!pid)
		return cli_fail(CMD, "a PID is needed\n%s", usage);
	if (flags & SLUICE_CKPT_SUSPEND) {
		if ((rc = sluice_process_checkpoint((int)pid, SLUICE_CKPT_SUSPEND, timeout, &s)))
			return cli_error(CMD, "suspend", rc);
		if (flags & SLUICE_CKPT_RESUME)
			usleep((useconds_t)(hold * 1e6));
	}
	if ((flags & SLUICE_CKPT_RESUME) && (rc = sluice_process_checkpoint((int)pid, SLUICE_CKPT_RESUME, 0, &r)))
		return cli_error(CMD, "resume", rc);
	if (json) {
		printf("{\"pid\":%u,\"lock_s\":%.6f,\"checkpoint_s\":%.6f,\"restore_s\":%.6f,\"unlock_s\":%.6f,"
		       "\"gpu_bytes_moved\":%llu,\"gpu_bytes_restored\":%llu,\"held_s\":%.3f,\"state\":\"%s\"}\n",
		       pid, s.lock_s, s.checkpoint_s, r.restore_s, r.unlock_s, (unsigned long long)s.gpu_bytes,
		       (unsigned long long)r.gpu_bytes, flags == (SLUICE_CKPT_SUSPEND | SLUICE_CKPT_RESUME) ? hold : 0.0,
		       sluice_process_state_name(flags & SLUICE_CKPT_RESUME ? r.state : s.state));
		return 0;
	}
	if (flags & SLUICE_CKPT_SUSPEND)
		printf("pid %u: lock %.3f s, checkpoint %.3f s (%.2f GB of GPU memory to host memory)\n", pid, s.lock_s,
		       s.checkpoint_s, (double)s.gpu_bytes / 1e9);
	if (flags & SLUICE_CKPT_RESUME)
		printf("pid %u: restore %.3f s (%.2f GB back on the GPU), unlock %.3f s\n", pid, r.restore_s,
		       (double)r.gpu_bytes / 1e9, r.unlock_s);
	printf("pid %u is %s\n", pid, sluice_process_state_name(flags & SLUICE_CKPT_RESUME ? r.state : s.state));
	return 0;
}
