/* stderr logging with subsystem tags; level from SLUICE_LOG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

int sl__log_level = SLUICE_LOG_WARN;

static const char *const sl_level_name[] = { "error", "warn", "info", "debug" };

__attribute__((constructor)) static void sl_log_init(void)
{
	const char *v = getenv("SLUICE_LOG");

	if (!v)
		return;
	for (int i = 0; i < 4; i++)
		if (!strcmp(v, sl_level_name[i]))
			sl__log_level = i;
}

void sluice_set_log_level(enum sluice_log_level level)
{
	if (level >= SLUICE_LOG_ERROR && level <= SLUICE_LOG_DEBUG)
		sl__log_level = level;
}

void sl__log(int level, const char *tag, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (level > sl__log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* One fprintf per line so lines from threads do not interleave. */
	if (level < 0)
		fprintf(stderr, "sluice[%s] %s\n", tag, line);
	else
		fprintf(stderr, "sluice[%s] %s: %s\n", tag, sl_level_name[level], line);
}
