/*
 * Backend selection when io_uring is blocked, as a seccomp policy of a
 * container does: auto falls back to psync and says why; a forced uring
 * backend fails with that reason; transfers still work.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "t_util.h"

static int block_io_uring(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -errno;
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return -errno;
	return 0;
}

int main(void)
{
	struct sluice_config *cfg;
	struct sluice_engine *eng;
	struct sluice_engine_info info = SLUICE_ENGINE_INFO_INIT;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	char path[600], *want, got[10000];
	int rc;

	snprintf(path, sizeof(path), "%s/p.bin", t_dir("t_probe"));
	want = t_make_file(path, sizeof(got), 9);
	unsetenv("SLUICE_BACKEND");
	setenv("SLUICE_GPU", "0", 1);

	/* Before: io_uring is chosen where the kernel allows it. */
	if (sluice_engine_open(&eng, NULL) == 0) {
		T_CHECK(sluice_engine_get_info(eng, &info) == 0);
		printf("unrestricted: backend %s\n", info.backend);
		sluice_engine_close(eng);
	}
	if (block_io_uring()) {
		printf("SKIP: cannot install a seccomp filter here\n");
		return T_SKIP;
	}
	T_CHECK(sluice_engine_open(&eng, NULL) == 0);
	T_CHECK(sluice_engine_get_info(eng, &info) == 0);
	printf("io_uring blocked: backend %s; unusable: %s\n", info.backend, info.unusable);
	T_CHECK(!strcmp(info.backend, "psync"));
	T_CHECK(strstr(info.unusable, "io_uring unusable") && strstr(info.unusable, "not permitted"));
	T_CHECK(sluice_read_to_gpu(eng, path, 0, sizeof(got), got, &rep) == (ssize_t)sizeof(got));
	T_CHECK(!memcmp(got, want, sizeof(got)) && !strncmp(rep.path, "psync", 5));
	sluice_engine_close(eng);

	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(sluice_config_set_backend(cfg, SLUICE_BACKEND_URING) == 0);
	rc = sluice_engine_open(&eng, cfg);
	T_CHECK(rc == SLUICE_EBACKEND && strstr(sluice_last_error_detail(), "io_uring_setup"));
	sluice_config_free(cfg);
	free(want);
	return t_done("t_probe");
}
