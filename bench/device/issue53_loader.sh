# Issue 53 on the GPU machine: the Loader's contract tests with torch and a GPU, then the loader before and after
# (bench/loader_ab.py: exp/a is main before #53, built beside; the new build runs the hold option as
# sluice.Loader does), raw records warm and cold, in one lease.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so SLUICE_BIN=$PWD/build/sluice
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
(cmake -S exp/a -B exp/a/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build exp/a/build --target sluice_ds_bench >/dev/null) > $OUT/build_a.log 2>&1 || { tail $OUT/build_a.log; exit 1; }
timeout 280 python3 -m pytest -v -rfs -n 4 -p no:cacheprovider tests/python/test_dataloader_contract.py tests/python/test_gpu.py tests/python/test_images.py tests/python/test_loader_resume.py tests/python/test_sluice.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "FAILED|ERROR " $OUT/pytest.log | head -20; tail -2 $OUT/pytest.log
SLUICE_BENCH_HOLD=1 timeout 280 python3 bench/loader_ab.py --a exp/a/build/sluice_ds_bench --b build/sluice_ds_bench --sluice build/sluice --reps 5 --temps warm > $OUT/loader_ab.log 2>&1
echo "ab rc=$?"; tail -8 $OUT/loader_ab.log
