# Issue 54, after `bash .dali/N/take.sh` for the parts before the last: DALI assembled, sluice built, the GPU
# tests of the image path (C and Python), then sluice against DALI at its best setting here (12 threads,
# hw_decoder_load 0.99) and its defaults, ResNet-18 and ResNet-50 and each loader alone, every contender reading
# from the page cache (e2e_images.py warms the packed shards and the JPEG files); then ResNet-18 and the loaders
# alone again with two decoders (SLUICE_IMAGE_DECODERS=2) beside the ceiling and DALI best in that process
# (D2=0 leaves that out).
# Carry .carry, .whl and the last DALI part.
. bench/device/issue54_setup.sh
timeout 230 python3 bench/e2e_images.py --images 20000 --steps 30 --alone-steps 70 --warm 4 --reps 3 --models resnet18,resnet50 \
	--only ceiling,sluice,dali,dali_best,sluice_decode,dali_best_alone --dali-best 12,0.99 \
	--out $OUT/warm.json 2>&1 | grep -E "^(resnet|decode)" | cut -c1-900
[ "${D2:-1}" = 0 ] && exit 0
SLUICE_IMAGE_DECODERS=2 timeout 110 python3 bench/e2e_images.py --images 20000 --steps 30 --alone-steps 70 --warm 4 --reps 3 \
	--models resnet18 --only ceiling,sluice,dali_best,sluice_decode,dali_best_alone --dali-best 12,0.99 \
	--out $OUT/warm_d2.json 2>&1 | grep -E "^(resnet|decode)" | cut -c1-900
