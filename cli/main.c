/* sluice: command-line front end of libsluice; main() dispatches to cmd_<name>.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int usage(FILE *f)
{
	fprintf(f, "usage: sluice <command> [options]\n\n"
		   "commands:\n"
		   "  bench     measure file <-> GPU/host throughput (like gdsio, fio)\n"
		   "  checkpoint  suspend a CUDA process's GPU memory to host memory, and resume it\n"
		   "  cp        copy files between local paths and s3://, either way\n"
		   "  doctor    check what on this machine slows data into the GPU, and how to fix it\n"
		   "  info      show the engine's backend, GPU and why other paths are unusable\n"
		   "  journey   run the Data Journey's experiments here, as an HTML report\n"
		   "  pack      turn a tree of files into a sharded dataset\n"
		   "  top       live view of disks, GPUs and running loaders\n"
		   "  tune      measure this machine and write the best threads, I/O size, queue depth\n"
		   "  inspect   records, fields, sizes and shards of a dataset\n"
		   "  verify    check every record's CRC and every bound of a dataset\n"
		   "  version   print the version\n\n"
		   "Run 'sluice <command> --help' for a command's options.\n");
	return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 1, argv + 1);
	if (!strcmp(argv[1], "checkpoint"))
		return cmd_checkpoint(argc - 1, argv + 1);
	if (!strcmp(argv[1], "cp"))
		return cmd_cp(argc - 1, argv + 1);
	if (!strcmp(argv[1], "doctor"))
		return cmd_doctor(argc - 1, argv + 1);
	if (!strcmp(argv[1], "journey"))
		return cmd_journey(argc - 1, argv + 1);
	if (!strcmp(argv[1], "info"))
		return cmd_info(argc - 1, argv + 1);
	if (!strcmp(argv[1], "pack"))
		return cmd_pack(argc - 1, argv + 1);
	if (!strcmp(argv[1], "inspect"))
		return cmd_inspect(argc - 1, argv + 1);
	if (!strcmp(argv[1], "tune"))
		return cmd_tune(argc - 1, argv + 1);
	if (!strcmp(argv[1], "top"))
		return cmd_top(argc - 1, argv + 1);
	if (!strcmp(argv[1], "verify"))
		return cmd_verify(argc - 1, argv + 1);
	if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
		printf("sluice %s\n", sluice_version());
		return 0;
	}
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		return usage(stdout);
	fprintf(stderr, "sluice: unknown command '%s' (see 'sluice help')\n", argv[1]);
	return 2;
}
