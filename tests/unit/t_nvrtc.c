/*
 * The GPU's augmentation kernel (src/image/augment.h, the same text the CPU
 * compiles as C) compiled by NVRTC for the GPUs sluice meets, on a machine
 * without one: a change to augment.h that NVRTC cannot compile fails here,
 * before any device time.  Skipped (77) where NVRTC does not load.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "image_augment_src.h"
#include "t_util.h"

int main(void)
{
	/* Ampere (A100), Ada (L40S), Hopper (H100, H200), Blackwell (B200). */
	static const int arch[][2] = { { 8, 0 }, { 8, 9 }, { 9, 0 }, { 10, 0 } };
	char *cubin = NULL;
	size_t n = 0;
	int rc = sl__nvrtc_compile(sl_augment_src, "sl_augment", 9, 0, &cubin, &n);

	if (rc == SLUICE_ENOGPU) {
		printf("t_nvrtc: skipped: %s\n", sluice_last_error_detail());
		return 77;
	}
	free(cubin);
	for (size_t i = 0; i < sizeof(arch) / sizeof(arch[0]); i++) {
		cubin = NULL;
		rc = sl__nvrtc_compile(sl_augment_src, "sl_augment", arch[i][0], arch[i][1], &cubin, &n);
		T_CHECK(rc == 0 && cubin && n > 4 && !memcmp(cubin, "\177ELF", 4));
		if (rc)
			fprintf(stderr, "sm_%d%d: %s\n", arch[i][0], arch[i][1], sluice_last_error_detail());
		free(cubin);
	}
	/* A source NVRTC refuses: an error carrying the compiler's log, naming the kernel and the architecture. */
	cubin = NULL;
	rc = sl__nvrtc_compile("extern \"C\" __global__ void broken(int *p) { p[0] = undeclared; }", "broken", 9, 0,
			       &cubin, &n);
	T_CHECK(rc == SLUICE_ECUDA && !cubin);
	T_CHECK(strstr(sluice_last_error_detail(), "could not compile broken for sm_90") &&
		strstr(sluice_last_error_detail(), "undeclared"));
	return t_done("t_nvrtc");
}
