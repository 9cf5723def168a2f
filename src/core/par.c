/*
 * Work shared by threads (core.h): the first error among them, with its
 * detail (details are thread-local), and a fan-out that runs one function
 * on several threads at once, the caller's among them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"

void sl__first_err_init(struct sl__first_err *fe)
{
	memset(fe, 0, sizeof(*fe));
	pthread_mutex_init(&fe->lock, NULL);
}

void sl__first_err_keep(struct sl__first_err *fe, int rc)
{
	if (!rc)
		return;
	pthread_mutex_lock(&fe->lock);
	if (!atomic_load(&fe->err)) {
		snprintf(fe->detail, sizeof(fe->detail), "%s", sluice_last_error_detail());
		atomic_store(&fe->err, rc);
	}
	pthread_mutex_unlock(&fe->lock);
}

int sl__first_err_raise(struct sl__first_err *fe)
{
	int rc = atomic_load(&fe->err);

	return rc ? sl__err(rc, "%s", fe->detail[0] ? fe->detail : sluice_strerror(rc)) : 0;
}

void sl__first_err_fini(struct sl__first_err *fe)
{
	pthread_mutex_destroy(&fe->lock);
}

void sl__fanout(unsigned n, void *(*fn)(void *arg), void *arg)
{
	pthread_t th[256];
	unsigned started = 0;

	if (n > 256)
		n = 256;
	/* Threads that cannot start leave their share to the others: the caller's always runs. */
	while (started + 1 < n && pthread_create(&th[started], NULL, fn, arg) == 0)
		started++;
	fn(arg);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}
