# Issue 54 on the GPU machine: DALI beside sluice on ResNet-18 (bench/e2e_images.py), a first look in what device
# time was left. DALI comes in parts (../shared/tools/carry-dali.sh .dali): `bash .dali/1/take.sh` ... with the
# parts before, each within the machine's warm window, then this script carrying .carry and the last part.
bash .dali/4/take.sh >/dev/null && . /var/tmp/dali-env.sh || { echo "DALI did not assemble"; exit 1; }
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 SLUICE_LIB=$PWD/build/libsluice.so SLUICE_BIN=$PWD/build/sluice
export PYTHONPATH=$PWD/python:$PYTHONPATH
python3 -c "import nvidia.dali as d; print('DALI', d.__version__)"
timeout 240 python3 bench/e2e_images.py --only ceiling,sluice,dali,dali_best --models resnet18 --reps 1 \
	--images ${IMAGES:-7000} --steps 20 --warm 4 --out $OUT/e2e_dali.json 2>&1 | grep -v "^$" | tail -6
