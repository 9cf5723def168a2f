/*
 * sluice: command-line front end of libsluice; main() dispatches to cmd_<name>.c by the table below.  A command
 * marked json prints JSON on stdout with --json, its failures included (cli.h: cli_json_mode); journey's and
 * diagnose's --json name a file instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	int json;
	const char *what;
} cli_cmds[] = {
	{ "bench", cmd_bench, 1, "measure file <-> GPU/host throughput (like gdsio, fio)" },
	{ "checkpoint", cmd_checkpoint, 1, "suspend a CUDA process's GPU memory to host memory, and resume it" },
	{ "cp", cmd_cp, 1, "copy files between any two stores: local paths, s3://, http(s)://" },
	{ "doctor", cmd_doctor, 1, "check what on this machine slows data into the GPU, and how to fix it" },
	{ "info", cmd_info, 1, "show the engine's backend, GPU and why other paths are unusable" },
	{ "inspect", cmd_inspect, 1, "records, fields, sizes and shards of a dataset" },
	{ "journey", cmd_journey, 0, "run the Data Journey's experiments here, as an HTML report" },
	{ "diagnose", cmd_diagnose, 0, "run a training script unchanged and report where its pipeline loses time" },
	{ "load", cmd_load, 1, "load a model checkpoint's tensors into GPU memory; --bench: beside a plain read" },
	{ "pack", cmd_pack, 1, "turn a tree of files into a sharded dataset" },
	{ "top", cmd_top, 1, "live view of CPUs, memory, disks, network, GPUs and running loaders" },
	{ "tune", cmd_tune, 1, "measure this machine and write the best threads, I/O size, queue depth" },
	{ "verify", cmd_verify, 1, "check every record's CRC and every bound of a dataset" },
};

/* --json among a command's arguments (not after "--", where a script's own begin). */
static int cli_wants_json(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--json"))
			return 1;
	return 0;
}

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
		if (!strcmp(argv[1], cli_cmds[i].name)) {
			cli_json_mode = cli_cmds[i].json && cli_wants_json(argc - 1, argv + 1);
			return cli_json_end(cli_cmds[i].name, cli_cmds[i].run(argc - 1, argv + 1));
		}
	cli_json_mode = cli_wants_json(argc - 1, argv + 1);
	if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
		for (int i = 2; i < argc; i++)
			if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
				printf("usage: sluice version [--json]\n  the library's version; --json: as {\"version\": ...}\n");
				return 0;
			} else if (strcmp(argv[i], "--json")) {
				return cli_fail("version", "unknown option '%s'", argv[i]);
			}
		if (cli_json_mode) {
			printf("{\"version\":");
			cli_json_str(sluice_version());
			printf(",\"command\":\"%s\"}\n", SLUICE_VERSION_STRING);
		} else {
			printf("sluice %s\n", sluice_version());
		}
		return 0;
	}
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		return usage(stdout);
	return cli_fail("", "unknown command '%s' (see 'sluice help')", argv[1]);
}
