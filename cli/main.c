/* sluice: command-line front end of libsluice; main() dispatches to cmd_<name>.c by the table below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *what;
} cli_cmds[] = {
	{ "bench", cmd_bench, "measure file <-> GPU/host throughput (like gdsio, fio)" },
	{ "checkpoint", cmd_checkpoint, "suspend a CUDA process's GPU memory to host memory, and resume it" },
	{ "cp", cmd_cp, "copy files between any two stores: local paths, s3://, http(s)://" },
	{ "doctor", cmd_doctor, "check what on this machine slows data into the GPU, and how to fix it" },
	{ "info", cmd_info, "show the engine's backend, GPU and why other paths are unusable" },
	{ "inspect", cmd_inspect, "records, fields, sizes and shards of a dataset" },
	{ "journey", cmd_journey, "run the Data Journey's experiments here, as an HTML report" },
	{ "diagnose", cmd_diagnose, "run a training script unchanged and report where its pipeline loses time" },
	{ "load", cmd_load, "load a model checkpoint's tensors into GPU memory; --bench: beside a plain read" },
	{ "pack", cmd_pack, "turn a tree of files into a sharded dataset" },
	{ "top", cmd_top, "live view of CPUs, memory, disks, network, GPUs and running loaders" },
	{ "tune", cmd_tune, "measure this machine and write the best threads, I/O size, queue depth" },
	{ "verify", cmd_verify, "check every record's CRC and every bound of a dataset" },
};

static int usage(FILE *f)
{
	fprintf(f, "usage: sluice <command> [options]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(cli_cmds) / sizeof(cli_cmds[0]); i++)
		fprintf(f, "  %-11s %s\n", cli_cmds[i].name, cli_cmds[i].what);
	fprintf(f, "  %-11s %s\n\nRun 'sluice <command> --help' for a command's options.\n", "version", "print the version");
	return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	for (size_t i = 0; i < sizeof(cli_cmds) / sizeof(cli_cmds[0]); i++)
		if (!strcmp(argv[1], cli_cmds[i].name))
			return cli_cmds[i].run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
		printf("sluice %s\n", sluice_version());
		return 0;
	}
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		return usage(stdout);
	fprintf(stderr, "sluice: unknown command '%s' (see 'sluice help')\n", argv[1]);
	return 2;
}
