export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so SLUICE_BIN=$PWD/build/sluice
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
timeout 200 python3 -m pytest -v -rfs -p no:cacheprovider tests/python/test_dcp.py -k "metadata" > $OUT/pytest.log 2>&1
echo "rc=$?"; grep -E "FAILED|ERROR " $OUT/pytest.log | head; tail -2 $OUT/pytest.log
