#!/bin/bash
# The GPU machine's work for issues #2 to #5, in steps chosen by STEPS (default: all):
#   tests  GPU tests, plain and under compute-sanitizer memcheck
#   first  a one-shot call's start-up toll (bench/first_call.py; FIRST_ARGS)
#   bench  the engine benchmark with its sweeps (bench/engine_bench.py; BENCH_SECONDS, BENCH_ARGS)
#   ds     the dataset benchmarks that need the GPU machine
#   wait   the loader's consumer wait under a synthetic step a little longer than its time per batch
#   loader the loader against PyTorch's DataLoader (bench/loader_bench.py; LOADER_ARGS)
#   packing token packing: real tokens/s to the GPU, against naive padding (bench/packing_bench.py)
#   python the Python package's tests (GPU ones included), the two examples, bench/python_bench.py
#   chapter7 the Data Journey report's chapter 7 loop (bench/chapter7_bench.py; CH7_ARGS)
#   s3     object storage: t_s3 and tests/python/test_s3.py against the S3 test server, then
#          bench/s3_bench.py (S3_ARGS, S3_SECONDS) and bench/s3_loader_bench.py (S3L_ARGS, S3L_SECONDS)
#   images images in the loader (issue #38; not in the default STEPS): its GPU tests (test_shard_decode.py's
#          nvCOMP ones need the nvidia-libnvcomp-cu13 wheel in .whl), examples/train_images.py, an image loader
#          under compute-sanitizer, a trace of training steps fed by it, bench/driver_contention.py, and
#          bench/e2e_images.py (E2E_ARGS)
# memcheck ignores failed API calls: sluice asks cuPointerGetAttribute about host pointers on
# purpose, and cuFileDriverOpen frees a null pointer inside libcufile.
# Every step has its own time limit so a hang cannot eat the session's device time.
# Results land in $OUT (or ./out).  Prepare the carried folders first, on the CPU machine:
# bench/prepare_gpu_machine.sh; the device tool carries .carry and .whl.
OUT="${OUT:-out}"
STEPS="${STEPS:-tests first bench ds wait loader packing python chapter7 s3}"
mkdir -p "$OUT"
. bench/gpu_machine.sh || { cmake --build build 2>&1 | grep error | head; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
	(cd build && timeout 60 ctest -R cuda_decls --output-on-failure 2>&1) > "$OUT/ctest.log"; tail -3 "$OUT/ctest.log"
	timeout 60 ./build/tests/t_gpu > "$OUT/t_gpu.log" 2>&1; rc=$?; echo "t_gpu rc=$rc"; tail -3 "$OUT/t_gpu.log"
	if [ $rc = 0 ]; then
		timeout "${MEMCHECK_SECONDS:-120}" compute-sanitizer --tool memcheck --report-api-errors no \
			--error-exitcode 1 ./build/tests/t_gpu > "$OUT/memcheck.log" 2>&1
		echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|t_gpu:" "$OUT/memcheck.log" | tail -5
	fi
fi

if has first; then
	PYTHONUNBUFFERED=1 SLUICE_LIB=build/libsluice.so PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} \
		timeout "${FIRST_SECONDS:-300}" python3 bench/first_call.py --out "$OUT/first_call.json" ${FIRST_ARGS} 2>&1 | tail -5
fi

if has bench; then
	PYTHONUNBUFFERED=1 timeout "${BENCH_SECONDS:-420}" python3 bench/engine_bench.py --sluice build/sluice \
		--fio .carry/fio --reps 3 --out "$OUT/engine_bench.json" ${BENCH_ARGS} 2>&1 | tee "$OUT/bench.log" | tail -25
fi

if has ds; then
	# Issue #3: a dataset read into GPU memory against the engine's raw read of the same shards,
	# and the foreign-format readers against their Python reference readers.
	D3="${D3_DIR:-/var/tmp/sluice-d3}"
	mkdir -p "$D3"
	[ -d "$D3/r16k" ] || ./build/sluice_ds_bench makeblob "$D3/r16k" 250000 16384
	timeout 240 ./build/sluice_ds_bench seqread "$D3/r16k" gpu | tee "$OUT/seqread_gpu.json"
	PYTHONUNBUFFERED=1 timeout "${READERS_SECONDS:-300}" python3 bench/readers_bench.py --ds-bench build/sluice_ds_bench --dir "$D3" \
		--out "$OUT/readers_bench.json" ${READERS_ARGS} 2>&1 | tail -4
fi

if has wait; then
	trace() { [ -n "$WAIT_TRACE" ] && mkdir -p "$OUT/traces" && export SLUICE_TRACE="$OUT/traces/$1.json"; }
	# Consumer wait with a synthetic step a little longer than the loader's own time per batch (target < 1%).
	D4="${D4_DIR:-/var/tmp/sluice-d4}"
	mkdir -p "$D4"
	[ -d "$D4/r16k" ] || ./build/sluice_ds_bench makeblob "$D4/r16k" 100000 16384
	for pf in ${WAIT_PREFETCH:-0}; do for temp in ${WAIT_TEMPS:-warm cold}; do
		# Warm epochs of this set are short (a quarter of a second): several, so the run is not all
		# start-up. After the first, a "cold" epoch would be warm: one.
		ep=1; [ $temp = warm ] && ep=${WAIT_EPOCHS:-5}
		unset SLUICE_TRACE
		# The loader alone (a consumer that does nothing): the median of its time per batch over
		# WAIT_REPS runs (one run varies by 10-15% from the next on these machines) sets the step,
		# 10% longer.  Prefetch: batches the loader keeps ready (0: its default).
		for rep in $(seq ${WAIT_REPS:-3}); do
			./build/sluice_ds_bench loader "$D4/r16k" gpu 256 0 $temp $pf $ep
		done > "$OUT/alone.json"
		cat "$OUT/alone.json" >> "$OUT/loader_alone.json"
		step=$(python3 -c 'import json,statistics,sys; b=[json.loads(l)["batch_us"] for l in open(sys.argv[1])]; print("alone: batch us", b, file=sys.stderr); print(int(1.1 * statistics.median(b)))' "$OUT/alone.json")
		rm "$OUT/alone.json"
		# WAIT_REPS runs with that step as a CPU spin, then as a GPU kernel on the stream the batches
		# are ordered on (the CPU thread runs ahead as a training loop's does, and the GPU's idle share
		# is measured with CUDA events); the median of each is the result.
		for on in cpu gpu; do
			arg=$step json=loader_step.json txt=wait.txt what=wait
			[ $on = gpu ] && arg=g$step json=loader_gpustep.json txt=gpuwait.txt what="GPU idle"
			for rep in $(seq ${WAIT_REPS:-3}); do
				trace "$on-$temp-$pf-$rep"
				timeout 120 ./build/sluice_ds_bench loader "$D4/r16k" gpu 256 "$arg" $temp $pf $ep | tee -a "$OUT/$json" |
					python3 -c 'import json,sys; j=json.load(sys.stdin); l=j["loader"]; g=j["gpu_step"]
head = ([j["temp"], j["epochs"], "epochs, prefetch '$pf' step", j["step_us"], "us: wait", round(100*l["gpu_wait_share"],2), "% (with the fills", round(100*l["gpu_wait_share_with_fill"],2), "%, fills", l["fill_us"], "us)", l["verdict"], "by tenth:", j["wait_share_by_tenth"], "longest", j["max_wait_us"], "us at (epoch, batch)", j["max_wait_at"]]
	if j["step_on"] == "cpu" else
	[j["temp"], "prefetch '$pf' GPU step", j["step_us"], "us:", g["kernels"], "kernels, GPU idle", round(100*g["idle_share"],2), "% (less launch gaps of", g["launch_gap_us"], "us:", round(100*g["idle_share_less_launch_gaps"],2), "%) wait by tenth:", j["wait_share_by_tenth"]])
print(*head, "steal by tenth:", j["steal_share_by_tenth"], j["vmstat"], "canary us by tenth:", j["canary_us_by_tenth"])'
			done | tee "$OUT/$txt"
			python3 -c 'import re,statistics,sys; w=[float(re.search(sys.argv[2] + " ([0-9.-]+) %", l).group(1)) for l in open(sys.argv[1])]; print("median", sys.argv[2], statistics.median(w), "%")' "$OUT/$txt" "$what"
		done
	done; done
	unset SLUICE_TRACE
	# WAIT_TRACE=1: each run's spans (SLUICE_TRACE), summed up by bench/trace_report.py, in one archive.
	if [ -n "$WAIT_TRACE" ]; then
		for f in "$OUT"/traces/*.json; do echo "== $f"; python3 bench/trace_report.py "$f"; done > "$OUT/trace_report.txt"
		tar -C "$OUT" -czf "$OUT/traces.tgz" traces && rm -r "$OUT/traces"
	fi
fi

if has loader; then
	PYTHONUNBUFFERED=1 timeout "${LOADER_SECONDS:-300}" python3 bench/loader_bench.py --sluice build/sluice \
		--ds-bench build/sluice_ds_bench --out "$OUT/loader_bench.json" ${LOADER_ARGS} 2>&1 | tail -12
fi

if has packing; then
	timeout 120 python3 bench/packing_bench.py --sluice build/sluice --ds-bench build/sluice_ds_bench \
		--out "$OUT/packing_bench.json" ${PACKING_ARGS} 2>&1 | tail -4
fi

if has python; then
	# The package as a user installs it, offline: built by scikit-build-core, the library bundled.
	rm -rf /tmp/sluice-pkg
	timeout 300 python3 -m pip install -q --no-index --no-build-isolation --no-deps --target /tmp/sluice-pkg . \
		> "$OUT/pip_install.log" 2>&1 && (cd /tmp && env -u SLUICE_LIB PYTHONPATH=/tmp/sluice-pkg python3 -c '
import numpy as np, sluice, torch
t = torch.arange(1 << 20, device="cuda")
sluice.write_from_gpu("/tmp/pkg.bin", t)
u = torch.zeros_like(t)
sluice.read_to_gpu("/tmp/pkg.bin", u)
print("pip install . (offline):", "OK" if torch.equal(t, u) else "MISMATCH", sluice._lib.lib._name)')
	[ $? = 0 ] || { echo "pip install . failed"; tail -5 "$OUT/pip_install.log"; }
	export SLUICE_LIB=build/libsluice.so SLUICE_BIN=build/sluice PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
	timeout 120 python3 -m pytest -q -rs tests/python 2>&1 | tee "$OUT/pytest.log" | tail -5
	for ex in train_llm_packed train_images; do  # each must finish inside a minute, data making included
		t0=$(date +%s.%N)
		timeout 90 python3 examples/$ex.py --sluice build/sluice > "$OUT/$ex.log" 2>&1
		echo "examples/$ex.py: rc $?, $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"; tail -3 "$OUT/$ex.log"
	done
	PYTHONUNBUFFERED=1 timeout "${PYBENCH_SECONDS:-240}" python3 bench/python_bench.py --sluice build/sluice \
		--out "$OUT/python_bench.json" ${PYBENCH_ARGS} 2>&1 | tail -20
fi

if has chapter7; then
	PYTHONUNBUFFERED=1 SLUICE_LIB=build/libsluice.so PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} timeout \
		"${CH7_SECONDS:-240}" python3 bench/chapter7_bench.py --sluice build/sluice ${CH7_ARGS} 2>&1 | tail -6
fi

if has s3; then
	export SLUICE_LIB=build/libsluice.so SLUICE_BIN=build/sluice PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
	timeout 180 python3 tests/remote/with_s3_server.py build/tests/t_s3 > "$OUT/t_s3.log" 2>&1
	echo "t_s3 rc=$?"; grep -E "CHECK|PASS|SKIP" "$OUT/t_s3.log" | tail -3
	timeout 300 python3 -m pytest -q -rs tests/python/test_s3.py > "$OUT/pytest_s3.log" 2>&1; tail -4 "$OUT/pytest_s3.log"
	if [ "${S3_SECONDS:-420}" != 0 ]; then
		PYTHONUNBUFFERED=1 timeout "${S3_SECONDS:-420}" python3 tests/remote/with_s3_server.py python3 bench/s3_bench.py \
			--out "$OUT/s3_bench.json" ${S3_ARGS} 2>&1 | grep -v "HTTP/1.1" | tee "$OUT/s3_bench.log" | tail -30
	fi
	if [ "${S3L_SECONDS:-420}" != 0 ]; then
		PYTHONUNBUFFERED=1 timeout "${S3L_SECONDS:-420}" python3 tests/remote/with_s3_server.py python3 bench/s3_loader_bench.py \
			--sluice build/sluice --out "$OUT/s3_loader_bench.json" ${S3L_ARGS} 2>&1 | grep -v "HTTP/1.1" |
			tee "$OUT/s3_loader.log" | tail -25
	fi
fi

if has images; then
	export SLUICE_LIB=$PWD/build/libsluice.so SLUICE_BIN=$PWD/build/sluice SLUICE_CONFIG= PYTHONUNBUFFERED=1
	export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
	(cd build && timeout 120 ctest -R "t_gpu|t_image|t_cuda_decls|t_loader" 2>&1) | grep -E "tests passed|Failed"
	timeout 300 python3 -m pytest -q -rs -p no:logging tests/python/test_images.py tests/python/test_gpu.py \
		tests/python/test_loader_resume.py tests/python/test_shard_decode.py 2>&1 | tail -5
	CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 90 python3 examples/train_images.py --sluice build/sluice 2>&1 | tail -4
	timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 -c "
import sluice, subprocess, tempfile, numpy as np
from PIL import Image
d = tempfile.mkdtemp()
for i in range(64):
    import os; os.makedirs(f'{d}/i/{i % 2}', exist_ok=True)
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (90, 120, 3), np.uint8)).save(f'{d}/i/{i % 2}/{i}.jpg')
subprocess.run(['$PWD/build/sluice', 'pack', '--from-dir', f'{d}/i', '--quiet', f'{d}/ds'], check=True)
ld = sluice.Loader(sluice.Dataset(f'{d}/ds'), shuffle=True, batch_size=16, device='cuda', images=sluice.Images('data', size=32))
print(sum(len(b.ids) for b in ld), 'images through compute-sanitizer')" > "$OUT/images_memcheck.log" 2>&1
	echo "image loader memcheck rc=$?"; grep -E "ERROR SUMMARY|images through" "$OUT/images_memcheck.log" | tail -3
	timeout 150 python3 bench/e2e_images.py --images 8000 --steps 12 --models resnet18 --trace "$OUT/trace.json" 2>&1 |
		grep -E "^stream|^model stream" | head -12
	timeout 200 python3 bench/driver_contention.py --data /var/tmp/sluice-e2e/ds --out "$OUT/contention.json" 2>&1 | tail -16
	timeout "${E2E_SECONDS:-330}" python3 bench/e2e_images.py --out "$OUT/e2e.json" ${E2E_ARGS:---images 12000 --reps 3 --steps 24} \
		2>&1 | grep -E "^resnet|^decode|Error"
fi
