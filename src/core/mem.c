/* Growable buffers. */
#include <errno.h>
#include <stdlib.h>

#include "core/core.h"

int sl__reserve(void *pp, size_t *cap, size_t n)
{
	void **p = pp, *q;

	if (n <= *cap)
		return 0;
	q = realloc(*p, n);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}
