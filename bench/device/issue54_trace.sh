# Issue 54, the call after issue54_base.sh (DALI still in /var/tmp): torch.profiler traces of ResNet-18 steps fed
# by nothing (the ceiling), sluice and DALI at its best setting, then variants, each beside the ceiling in its own
# process (ResNet-18, and the loader alone): VARIANTS="name=VAR=value,VAR=value ...", e.g.
# VARIANTS="d1=SLUICE_IMAGE_DECODERS=1 d2=SLUICE_IMAGE_DECODERS=2 p2=SLUICE_IMAGE_PRODUCERS=2" sh ... variants.
# (The session of 2026-12-02 ran it with temporary SLX_* switches of a build that was not committed:
# docs/BENCHMARKS.md says which.)
[ -f /var/tmp/dali-env.sh ] && . /var/tmp/dali-env.sh; export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
mkdir -p /var/tmp/r /var/tmp/tr
E="python3 bench/e2e_images.py --images 10000 --warm 4"
if [ "${1:-trace}" = trace ]; then
	timeout 200 $E --steps 12 --models resnet18 --trace /var/tmp/tr/t --trace-with ceiling,sluice,dali_best \
		--out $OUT/trace.json 2>&1 | grep -v "^$" | grep -v Warning | cut -c1-400 | tail -60
fi
for v in ${VARIANTS:-"d1=SLUICE_IMAGE_DECODERS=1" "d2=SLUICE_IMAGE_DECODERS=2" "d4=SLUICE_IMAGE_DECODERS=4"}; do
	env $(echo ${v#*=} | tr , " ") timeout 120 $E --steps 30 --reps 3 --models resnet18 --only ${ONLY:-ceiling,sluice,sluice_decode} \
		--out /var/tmp/r/${v%%=*}.json > /var/tmp/r/${v%%=*}.log 2>&1 || echo "${v%%=*} failed: $(tail -2 /var/tmp/r/${v%%=*}.log)"
	echo "${v%%=*}: $(grep -E '^(resnet18|decode)' /var/tmp/r/${v%%=*}.log | cut -c1-330)"
done
tar czf $OUT/variants_${1:-trace}.tgz -C /var/tmp/r $(cd /var/tmp/r && ls *.json *.log)
