# Issue 54: the GPU tests of the image path on the stage table (stage.c), C and Python, on a fresh machine.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
(cd build && timeout 60 ctest -R "loader|stages|image|cuda_decls|gpu|nvrtc" --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc=$?: $(grep 'tests passed' $OUT/ctest.log)"; grep -E "Failed|Skipped|Not Run" $OUT/ctest.log | head -5)
timeout 120 python3 -m pytest -q -rfs -n 6 -p no:cacheprovider tests/python/test_images.py tests/python/test_gpu.py \
	tests/python/test_imagefolder.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)|SKIPPED" $OUT/pytest.log | head -8
