#!/bin/bash
# Issue #3 benchmarks that need no GPU: packing 100k files of 16 KiB against
# tar -cf of the same tree, and opening an index of 10^8 records.
# Usage: bench/datasets_bench.sh [BUILD_DIR] [WORK_DIR]   (root, for drop_caches)
set -e
B="${1:-build-rel}"
W="${2:-/var/tmp/sluice-dsbench}"
REPS="${REPS:-3}"
mkdir -p "$W"
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# 1. 100 classes x 1000 files of 16 KiB of random bytes, in the page cache.
if [ ! -d "$W/tree" ]; then
	python3 - "$W/tree" <<'PY'
import os, sys
r = os.urandom(16384 * 64)
for c in range(100):
    d = f"{sys.argv[1]}/class{c:03d}"; os.makedirs(d)
    for i in range(1000):
        k = (c * 1000 + i) % 63
        with open(f"{d}/img{i:04d}.jpg", "wb") as f:
            f.write(r[k * 16384:(k + 1) * 16384])
PY
fi
tar -cf - -C "$W" tree > /dev/null  # bring the tree into the page cache
tar_s=() ; tarsync_s=() ; pack_s=()
for r in $(seq "$REPS"); do
	rm -f "$W/t.tar"; t0=$(date +%s.%N); tar -cf "$W/t.tar" -C "$W" tree; t1=$(date +%s.%N); sync; t2=$(date +%s.%N)
	tar_s+=("$(echo "$t1 - $t0" | bc)"); tarsync_s+=("$(echo "$t2 - $t0" | bc)")
	rm -rf "$W/packed"; t0=$(date +%s.%N); "$B/sluice" pack --quiet --from-dir "$W/tree" "$W/packed" > /dev/null; t1=$(date +%s.%N)
	pack_s+=("$(echo "$t1 - $t0" | bc)")
	sync
done
tar_m=$(printf '%s\n' "${tar_s[@]}" | med); tarsync_m=$(printf '%s\n' "${tarsync_s[@]}" | med); pack_m=$(printf '%s\n' "${pack_s[@]}" | med)
echo "pack 100000 files x 16 KiB (median of $REPS, seconds): tar -cf $tar_m, tar -cf + sync $tarsync_m, sluice pack (durable) $pack_m"
echo "files/s: tar $(echo "100000 / $tar_m" | bc), tar+sync $(echo "100000 / $tarsync_m" | bc), sluice $(echo "100000 / $pack_m" | bc)"
echo "ratio sluice/tar = $(echo "scale=3; $tar_m / $pack_m" | bc), sluice/(tar+sync) = $(echo "scale=3; $tarsync_m / $pack_m" | bc)"

# 2. An index of 10^8 records: open time (cold) and resident index per record touched.
if [ ! -f "$W/big/index.sli" ]; then
	rm -rf "$W/big"; "$B/sluice_ds_bench" make "$W/big" 100000000
fi
"$B/sluice_ds_bench" open "$W/big" 11
"$B/sluice_ds_bench" resident "$W/big" 1000000
"$B/sluice_ds_bench" resident "$W/big" 100000000

# 3. Random record reads, cold, at queue depth QD: sluice (batches of 256 random records
#    through the engine, O_DIRECT) against fio randread (io_uring, O_DIRECT) on the same shard
#    files. A record of 4 KiB is stored as 4104 bytes, so O_DIRECT reads an 8 KiB aligned span
#    for it: fio at bs=8k reads the same bytes (bs=4k shown for reference); 16 KiB -> 20k / 16k.
FIO="${FIO:-fio}"
QD="${QD:-32}"
READS="${READS:-100000}"
[ -d "$W/r4k" ] || "$B/sluice_ds_bench" makeblob "$W/r4k" 1000000 4096
[ -d "$W/r16k" ] || "$B/sluice_ds_bench" makeblob "$W/r16k" 250000 16384
for set in "r4k 8k 4k" "r16k 20k 16k"; do
	read -r d same ref <<< "$set"
	files=$(ls "$W/$d"/shard-*.sls | paste -sd: -)
	for r in $(seq "$REPS"); do
		sync; echo 3 > /proc/sys/vm/drop_caches
		"$B/sluice_ds_bench" randread "$W/$d" "$QD" "$READS" | sed 's/^/sluice /'
		for bs in "$same" "$ref"; do
			sync; echo 3 > /proc/sys/vm/drop_caches
			"$FIO" --name=rr --filename="$files" --rw=randread --bs="$bs" --iodepth="$QD" --ioengine=io_uring \
				--direct=1 --fixedbufs --registerfiles --number_ios="$READS" --norandommap --output-format=terse \
				--terse-version=3 | awk -F';' -v bs="$bs" -v d="$d" '{printf "fio %s bs=%s iops %d\n", d, bs, $8}'
		done
	done
done
