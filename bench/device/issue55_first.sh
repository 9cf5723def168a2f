# Issue 55: where a fresh process's first sluice.load goes on the H200 (bench/ckpt_first.py), the checkpoint of
# bench/ckpt_bench.py (llama8b shape, 20 layers, 3 files), warm; then the checkpoint tests against the GPU.
# Carry .carry.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
timeout 120 python3 bench/ckpt_bench.py --make-only --shape llama8b --layers 20 --dir /var/tmp/sluice-ckpt >/dev/null 2>&1
D=/var/tmp/sluice-ckpt/llama8b-20; ls -la $D | head; cat $D/*.safetensors > /dev/null
timeout 200 python3 bench/ckpt_first.py $D --procs 3 --out $OUT/first.json
timeout 150 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_checkpoint.py tests/python/test_checkpoint_faults.py \
	tests/python/test_load_cli.py tests/python/test_dcp.py tests/python/test_models.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -5
