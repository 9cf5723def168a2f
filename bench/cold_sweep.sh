#!/bin/bash
# Cold sequential reads of one file: fio's best setting against `sluice bench` with several engine
# settings, pass for pass (interleaved, page cache dropped before each), to choose the engine's O_DIRECT
# defaults on a given disk.  Usage: bench/cold_sweep.sh FILE [SIZE] [REPS] (as root; fio at .carry/fio).
F="$1" SIZE="${2:-4G}" REPS="${3:-3}" FIO="${FIO:-.carry/fio}"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
gbs() { python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):]); 
r=j["jobs"][0]["read"] if "jobs" in j else j; print(round(r["io_bytes"]/r["runtime"]/1e6, 3) if "jobs" in j else j["gb_s"])'; }
configs=("fio 16M:16" "fio 4M:32" "sluice" "sluice --io-size 8M" "sluice --io-size 16M --queue-depth 2"
	"sluice --threads 16" "sluice --threads 8 --io-size 8M")
for rep in $(seq "$REPS"); do
	for c in "${configs[@]}"; do
		drop
		if [ "${c%% *}" = fio ]; then
			s=${c#fio }
			r=$("$FIO" --output-format=json --name=r --filename="$F" --rw=read --ioengine=io_uring --direct=1 \
				--fixedbufs --registerfiles --bs="${s%:*}" --iodepth="${s#*:}" --size="$SIZE" | gbs)
		else
			r=$(${SLUICE:-build/sluice} bench "$F" --cold --size "$SIZE" --json ${c#sluice} | gbs)
		fi
		echo "$rep | $c | $r"
	done
done
