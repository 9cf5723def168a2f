/* Small system helpers. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

int sl__mkdirs(char *path)
{
	for (char *p = path + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		char c = *p;

		*p = 0;
		int rc = mkdir(path, 0755) < 0 && errno != EEXIST ? -errno : 0;

		*p = c;
		if (rc || !c)
			return rc;
	}
}

int sluice_drop_page_cache(void)
{
	int fd, ok;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ok = write(fd, "3", 1) == 1;
	close(fd);
	return ok;
}
