/* sluice info: what the engine would use on this machine, and why. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* Every setting of the registry: its value in force and where it came from (sluice_setting_get). */
static int cli_settings(int json)
{
	struct sluice_setting s;
	struct sluice_config *cfg;
	int rc = sluice_config_new(&cfg); /* checks them all: a bad value is named */
	char bad[1024];

	/*
	 * The detail names the wrong one first ("SLUICE_X=..."); --json still lists them all, that one marked, in an
	 * object beside the error ({"settings": [...], "error": {...}}): a failure is an object with "error".
	 */
	snprintf(bad, sizeof(bad), "%s", rc ? sluice_last_error_detail() : "");
	if (rc && !json)
		return cli_error("info", "a setting is wrong", rc);
	sluice_config_free(cfg);
	if (json)
		printf(rc ? "{\"settings\":[" : "[");
	for (unsigned i = 0; sluice_setting_get(i, &s) == 0; i++) {
		if (!json) {
			printf("%-26s %-22s %-9s %s\n", s.name, s.value ? s.value : *s.def ? s.def : "-",
			       s.value ? (strcmp(s.origin, "the environment") ? "file" : "env") : "default", s.help);
			continue;
		}
		printf("%s{\"name\":", i ? "," : "");
		cli_json_str(s.name);
		printf(",\"type\":\"%s\",\"scope\":\"%s\",\"words\":", s.type, s.scope);
		cli_json_str(s.words ? s.words : "");
		printf(",\"default\":");
		cli_json_str(s.def);
		printf(",\"value\":");
		cli_json_str(s.value ? s.value : s.def);
		printf(",\"from\":");
		cli_json_str(s.value ? s.origin : "default");
		printf(",\"help\":");
		cli_json_str(s.help);
		if (!strncmp(bad, s.name, strlen(s.name)) && bad[strlen(s.name)] == '=') {
			printf(",\"error\":");
			cli_json_str(bad);
		}
		printf("}");
	}
	if (json && !rc)
		printf("]\n");
	if (!rc)
		return 0;
	if (json) {
		printf("]");
		cli_json_open("");
	}
	return cli_error("info", "a setting is wrong", rc);
}

int cmd_info(int argc, char **argv)
{
	struct sluice_engine *eng;
	struct sluice_engine_info in = SLUICE_ENGINE_INFO_INIT;
	int json = 0, settings = 0, rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (!strcmp(argv[i], "--settings"))
			settings = 1;
		else if (!strcmp(argv[i], "--help")) {
			printf("usage: sluice info [--settings] [--json]\n"
			       "  the engine this machine gives; --settings: every SLUICE_* setting, its value and\n"
			       "  where it came from (the environment, the settings file, the default).\n"
			       "  Numbers are decimal, as each setting's type says: whole numbers (8), sizes with an\n"
			       "  optional K, M, G or T (powers of 1024: 4M), seconds with an optional fraction (0.5);\n"
			       "  no 0x, no exponent, no sign.  --json: one object (--settings: a list); a failure is\n"
			       "  an object with \"error\" (--settings: the list under \"settings\" beside it).\n");
			return 0;
		} else
			return cli_fail("info", "unknown option '%s'", argv[i]);
	}
	if (settings)
		return cli_settings(json);
	rc = sluice_engine_open(&eng, NULL);
	if (rc)
		return cli_error("info", "cannot open engine", rc);
	if ((rc = sluice_engine_get_info(eng, &in))) {
		sluice_engine_close(eng);
		return cli_error("info", "engine", rc);
	}
	if (json) {
		printf("{\"version\":\"%s\",\"backend\":", sluice_version());
		cli_json_str(in.backend);
		printf(",\"gpu\":%d,\"gpu_name\":", in.gpu);
		cli_json_str(in.gpu_name);
		printf(",\"gpu_unusable\":");
		cli_json_str(in.gpu_unusable);
		printf(",\"numa_node\":%d,\"ngpus\":%u", in.numa_node, in.ngpus);
		printf(",\"gds\":%d,\"threads\":%u,\"queue_depth\":%u,\"max_transfer_size\":%zu,"
		       "\"buffer_pool_size\":%zu,\"pool_pinned\":%d,\"uring_fixed_buffers\":%d,\"unusable\":",
		       in.gds, in.threads, in.queue_depth, in.max_transfer_size, in.buffer_pool_size,
		       in.pool_pinned, in.uring_fixed_buffers);
		cli_json_str(in.unusable);
		printf("}\n");
	} else {
		printf("sluice %s\nbackend: %s%s\n", sluice_version(), in.backend, in.gds ? " + gds" : "");
		if (in.gpu >= 0)
			printf("gpu: %d %s (NUMA node %d%s)%s\n", in.gpu, in.gpu_name, in.numa_node,
			       in.numa_node < 0 ? ": none reported" : ", the workers run there",
			       in.ngpus > 1 ? ", and more: SLUICE_DEVICE_IDS" : "");
		if (in.ngpus > 1)
			printf("gpus: %u served, the workers split among them\n", in.ngpus);
		else if (in.gpu < 0)
			printf("gpu: none (%s)\n", in.gpu_unusable);
		printf("threads: %u x %u slots of %zu bytes (pool %zu bytes, %s)\nio_uring fixed buffers: %s\n",
		       in.threads, in.queue_depth, in.max_transfer_size, in.buffer_pool_size,
		       in.pool_pinned ? "pinned" : "pageable", in.uring_fixed_buffers ? "yes" : "no");
		if (*in.unusable) {
			/* One indented line per unusable path. */
			printf("unusable:\n");
			for (const char *l = in.unusable; *l;) {
				size_t n = strcspn(l, "\n");

				printf("  %.*s\n", (int)n, l);
				l += n + (l[n] == '\n');
			}
		}
	}
	sluice_engine_close(eng);
	return 0;
}
