# Issue 54, first call after `bash .dali/N/take.sh` for the parts before the last (../shared/tools/carry-dali.sh):
# DALI assembled, sluice built, the image tests on the GPU (also with the SLX_ experiments of this session on),
# then the baseline side by side: ceiling, sluice, DALI at its defaults and at its best setting (swept once,
# alone), ResNet-18 and ResNet-50, and each loader alone.  Carry .carry, .whl and the last DALI part.
bash .dali/4/take.sh >/dev/null && . /var/tmp/dali-env.sh || { echo "DALI did not assemble"; exit 1; }
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
python3 -c "import nvidia.dali as d; print('DALI', d.__version__)"
timeout 100 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_images.py > $OUT/pytest.log 2>&1
echo "pytest images rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^FAILED|^ERROR" $OUT/pytest.log | head -5
SLX_SHARE=1 SLX_PREALLOC=1 timeout 100 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_images.py \
	> $OUT/pytest_share.log 2>&1
echo "pytest images, shared decoder rc=$?: $(tail -1 $OUT/pytest_share.log)"; grep -E "^FAILED|^ERROR" $OUT/pytest_share.log | head -5
timeout 420 python3 bench/e2e_images.py --images 10000 --steps 30 --warm 4 --reps 3 --models resnet18,resnet50 \
	--only ceiling,sluice,dali,dali_best,sluice_decode,dali_best_alone --dali-sweep "4,8,12;0.9,0.99" \
	--out $OUT/base.json 2>&1 | grep -E "^(resnet|decode|dali sweep)" | cut -c1-900
