#!/bin/sh
# Builds sluice on a GPU machine that has no liburing-dev installed, using
# Debian's liburing extracted into .carry/uring (see docs/BENCHMARKS.md).
# Source it: `. bench/gpu_machine.sh`; it exports LD_LIBRARY_PATH.
R=$(pwd)
U="$R/.carry/uring/usr"
PC="$U/lib/x86_64-linux-gnu/pkgconfig"
if [ -d "$PC" ]; then
	sed -i "s|=/usr|=$U|" "$PC/liburing.pc"
	export PKG_CONFIG_PATH="$PC" LD_LIBRARY_PATH="$U/lib/x86_64-linux-gnu"
fi
rm -f build/CMakeCache.txt
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build >/dev/null || return 1
