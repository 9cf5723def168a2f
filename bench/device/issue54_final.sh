# Issue 54, the session's last call after `bash .dali/N/take.sh` for the parts before the last: DALI assembled,
# sluice built, the GPU tests of the image path (C and Python), then sluice against DALI at today's best setting
# (12 threads, hw_decoder_load 0.99, from the sweep in issue54_base.sh) and its defaults, ResNet-18 and ResNet-50,
# each loader alone (70 batches: a longer pass than the model's).  Carry .carry, .whl and the last DALI part.
. bench/device/issue54_setup.sh
timeout 380 python3 bench/e2e_images.py --images 20000 --steps 30 --alone-steps 70 --warm 4 --reps 3 --models resnet18,resnet50 \
	--only ceiling,sluice,dali,dali_best,sluice_decode,dali_best_alone --dali-best 12,0.99 \
	--out $OUT/final.json 2>&1 | grep -E "^(resnet|decode)" | cut -c1-1200
