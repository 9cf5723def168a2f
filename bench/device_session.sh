#!/bin/bash
# One call on the GPU machine for issues #2 and #3: build, GPU tests (plain and
# under compute-sanitizer memcheck), the engine benchmark with sweeps, then the
# dataset benchmarks that need the GPU machine.  Set BENCH_SECONDS to leave room.  Every
# step has its own time limit so a hang cannot eat the session's device time.
# Results land in $OUT (or ./out).
OUT="${OUT:-out}"
mkdir -p "$OUT"
. bench/gpu_machine.sh || { cmake --build build 2>&1 | grep error | head; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
(cd build && timeout 150 ctest --output-on-failure 2>&1) > "$OUT/ctest.log"; tail -4 "$OUT/ctest.log"
timeout 90 ./build/tests/t_gpu > "$OUT/t_gpu.log" 2>&1; echo "t_gpu rc=$?"; tail -3 "$OUT/t_gpu.log"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./build/tests/t_gpu > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|t_gpu:" "$OUT/memcheck.log"
if [ -d .whl ]; then
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
		export PYTHONPATH=/tmp/site
fi
PYTHONUNBUFFERED=1 timeout "${BENCH_SECONDS:-420}" python3 bench/engine_bench.py --sluice build/sluice \
	--fio .carry/fio --reps 3 --out "$OUT/engine_bench.json" ${BENCH_ARGS} 2>&1 | tee "$OUT/bench.log" | tail -25

# Issue #3 on the GPU machine: a dataset read into GPU memory against the engine's raw read of the
# same shards, and the foreign-format readers against their Python reference readers.
D3="${D3_DIR:-/var/tmp/sluice-d3}"
mkdir -p "$D3"
[ -d "$D3/r16k" ] || ./build/sluice_ds_bench makeblob "$D3/r16k" 250000 16384
timeout 240 ./build/sluice_ds_bench seqread "$D3/r16k" gpu | tee "$OUT/seqread_gpu.json"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/readers_bench.py --ds-bench build/sluice_ds_bench --dir "$D3" \
	--out "$OUT/readers_bench.json" 2>&1 | tail -4
