/*
 * cuFile shim (libcufile.so.0).  Opening it is slow and it spawns threads,
 * so it is only loaded when the gds backend is probed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"

static struct sl__cufile_api sl_cf;
static const struct sl__cufile_api *sl_cf_ok;
static const char *sl_cf_why = "cuFile not loaded";
static char sl_cf_why_buf[256];
static pthread_once_t sl_cf_once = PTHREAD_ONCE_INIT;

static void sl_cufile_load(void)
{
	void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	sl_CUfileDrvProps_t props;
	sl_CUfileError_t e;

	if (!h) {
		snprintf(sl_cf_why_buf, sizeof(sl_cf_why_buf), "libcufile.so.0 not loadable: %s", dlerror());
		sl_cf_why = sl_cf_why_buf;
		return;
	}
	*(void **)&sl_cf.DriverOpen = dlsym(h, "cuFileDriverOpen");
	*(void **)&sl_cf.DriverClose = dlsym(h, "cuFileDriverClose_v2");
	if (!sl_cf.DriverClose)
		*(void **)&sl_cf.DriverClose = dlsym(h, "cuFileDriverClose");
	*(void **)&sl_cf.DriverGetProperties = dlsym(h, "cuFileDriverGetProperties");
	*(void **)&sl_cf.HandleRegister = dlsym(h, "cuFileHandleRegister");
	*(void **)&sl_cf.HandleDeregister = dlsym(h, "cuFileHandleDeregister");
	*(void **)&sl_cf.BufRegister = dlsym(h, "cuFileBufRegister");
	*(void **)&sl_cf.BufDeregister = dlsym(h, "cuFileBufDeregister");
	*(void **)&sl_cf.Read = dlsym(h, "cuFileRead");
	*(void **)&sl_cf.Write = dlsym(h, "cuFileWrite");
	if (!sl_cf.DriverOpen || !sl_cf.DriverGetProperties || !sl_cf.HandleRegister ||
	    !sl_cf.HandleDeregister || !sl_cf.Read || !sl_cf.Write) {
		sl_cf_why = "libcufile.so.0 lacks required symbols";
		return;
	}
	e = sl_cf.DriverOpen();
	if (e.err != SL_CU_FILE_SUCCESS) {
		snprintf(sl_cf_why_buf, sizeof(sl_cf_why_buf), "cuFileDriverOpen failed: cuFile error %d, CUDA %d",
			 e.err, e.cu_err);
		sl_cf_why = sl_cf_why_buf;
		return;
	}
	memset(&props, 0, sizeof(props));
	e = sl_cf.DriverGetProperties(&props);
	/* nvfs 0.0 means no nvidia-fs: cuFile would bounce through POSIX. */
	sl_cf.gds = e.err == SL_CU_FILE_SUCCESS &&
		    (props.nvfs.major_version || props.nvfs.minor_version);
	sl_cf_ok = &sl_cf;
}

const struct sl__cufile_api *sl__cufile(const char **why)
{
	pthread_once(&sl_cf_once, sl_cufile_load);
	if (!sl_cf_ok && why)
		*why = sl_cf_why;
	return sl_cf_ok;
}

