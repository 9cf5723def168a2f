# Issue 52 on the GPU machine, last round: from_pretrained with a config.json of 2^40 sizes under the machine's
# transformers (its worker was killed before the fix), the merged attacks' DCP, diagnose and checkpoint changes.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so SLUICE_BIN=$PWD/build/sluice
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
cat /proc/sys/vm/overcommit_memory > $OUT/overcommit.txt
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" > $OUT/versions.txt 2>&1
timeout 480 python3 -m pytest -v -rfs -n 4 -p no:cacheprovider tests/python/test_dcp.py tests/python/test_models.py tests/python/test_transformers.py tests/python/test_checkpoint.py tests/python/test_diagnose.py tests/python/test_gpu.py > $OUT/pytest.log 2>&1
echo "rc=$?"; cat $OUT/versions.txt $OUT/overcommit.txt; grep -E "FAILED|ERROR " $OUT/pytest.log | head -30; tail -3 $OUT/pytest.log
