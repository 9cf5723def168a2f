# Issue 54, after `bash .dali/N/take.sh` for the parts before the last: DALI assembled, sluice built, the GPU
# tests of the image path (C and Python), then sluice against DALI at its best setting here (12 threads,
# hw_decoder_load 0.99) and its defaults, ResNet-18 and ResNet-50 and each loader alone, every contender reading
# from the page cache (e2e_images.py warms the packed shards and the JPEG files); then ResNet-18 and the loaders
# alone again with two decoders (SLUICE_IMAGE_DECODERS=2) beside the ceiling and DALI best in that process.
# Carry .carry, .whl and the last DALI part.
bash .dali/4/take.sh >/dev/null && . /var/tmp/dali-env.sh || { echo "DALI did not assemble"; exit 1; }
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
(cd build && timeout 90 ctest -R "loader|stages|image|cuda_decls|gpu|nvrtc" --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc=$?: $(grep 'tests passed' $OUT/ctest.log)")
timeout 120 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_images.py tests/python/test_gpu.py \
	tests/python/test_imagefolder.py tests/python/test_stages_stranger.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -5
timeout 230 python3 bench/e2e_images.py --images 20000 --steps 30 --alone-steps 70 --warm 4 --reps 3 --models resnet18,resnet50 \
	--only ceiling,sluice,dali,dali_best,sluice_decode,dali_best_alone --dali-best 12,0.99 \
	--out $OUT/warm.json 2>&1 | grep -E "^(resnet|decode)" | cut -c1-900
SLUICE_IMAGE_DECODERS=2 timeout 110 python3 bench/e2e_images.py --images 20000 --steps 30 --alone-steps 70 --warm 4 --reps 3 \
	--models resnet18 --only ceiling,sluice,dali_best,sluice_decode,dali_best_alone --dali-best 12,0.99 \
	--out $OUT/warm_d2.json 2>&1 | grep -E "^(resnet|decode)" | cut -c1-900
