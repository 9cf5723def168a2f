/*
 * sluice doctor's io_uring check against a real seccomp filter, the one
 * verdict faked trees cannot reach: this process forbids io_uring_setup
 * (as a container runtime's profile does) and the check must fail, saying
 * seccomp blocks it and how to allow it.  Skips where seccomp filters
 * cannot be installed.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "t_util.h"

struct seen {
	int found;
	enum sluice_verdict v;
	char value[512], fix[512];
};

static int one(const struct sluice_check *c, void *arg)
{
	struct seen *s = arg;

	if (!strcmp(c->name, "io_uring")) {
		s->found = 1;
		s->v = c->verdict;
		snprintf(s->value, sizeof(s->value), "%s", c->value);
		snprintf(s->fix, sizeof(s->fix), "%s", c->fix);
	}
	return 0;
}

int main(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };
	struct seen before = { 0 }, after = { 0 };

	unsetenv("SLUICE_SYSROOT");
	T_CHECK(sluice_doctor(".", one, &before) == 0 && before.found);
	if (before.v != SLUICE_CHECK_OK) {
		printf("t_doctor: skip: io_uring is not usable here to begin with (%s)\n", before.value);
		return T_SKIP;
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		printf("t_doctor: skip: no seccomp filter here (%s)\n", strerror(errno));
		return T_SKIP;
	}
	T_CHECK(sluice_doctor(".", one, &after) == 0 && after.found);
	printf("io_uring under the filter: %s\n", after.value);
	T_CHECK(after.v == SLUICE_CHECK_FAIL);
	T_CHECK(strstr(after.value, "seccomp filter") && strstr(after.value, "io_uring_setup: Operation not permitted"));
	T_CHECK(strstr(after.fix, "seccomp") && strstr(after.fix, "io_uring_setup"));
	printf("t_doctor: %s\n", t_failures ? "FAIL" : "PASS");
	return t_failures ? 1 : 0;
}
