/* stderr logging with subsystem tags; level from SLUICE_LOG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

int sl__log_level = SLUICE_LOG_WARN;

static const char *const sl_level_name[] = { "error", "warn", "info", "debug" };

/*
 * SLUICE_LOG from the environment, checked by the registry (a bad value
 * leaves the default; sluice_config_new names it).  Not the settings file:
 * reading it here, as the library loads, would fix its contents before a
 * program could choose another (sluice tune does).
 */
__attribute__((constructor)) static void sl_log_init(void)
{
	const char *v = getenv("SLUICE_LOG");
	uint64_t level;

	if (v && sl__setting_num("SLUICE_LOG", v, "the environment", &level) == 0)
		sl__log_level = (int)level;
	sl__err_clear();
}

void sluice_set_log_level(enum sluice_log_level level)
{
	if (level >= SLUICE_LOG_ERROR && level <= SLUICE_LOG_DEBUG)
		sl__log_level = level;
}

void sl__log(int level, const char *tag, const char *fmt, ...)
{
	char line[4096]; /* whole, then redacted (error.c says why) */
	va_list ap;

	if (level > sl__log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	sl__redact_urls(line, sizeof(line));
	/* One fprintf per line so lines from threads do not interleave. */
	if (level < 0)
		fprintf(stderr, "sluice[%s] %s\n", tag, line);
	else
		fprintf(stderr, "sluice[%s] %s: %s\n", tag, sl_level_name[level], line);
}
