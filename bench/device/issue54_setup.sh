# Issue 54's last call of a lease, sourced (after `bash .dali/N/take.sh` for the parts before the last): DALI's
# last part and DALI assembled, sluice built from source, then the GPU tests of the image path (C and Python).
bash .dali/4/take.sh >/dev/null && . /var/tmp/dali-env.sh || { echo "DALI did not assemble"; exit 1; }
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
(cd build && timeout 90 ctest -R "loader|stages|image|cuda_decls|gpu|nvrtc" --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc=$?: $(grep 'tests passed' $OUT/ctest.log)")
timeout 120 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_images.py tests/python/test_gpu.py \
	tests/python/test_imagefolder.py tests/python/test_stages_stranger.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -5
