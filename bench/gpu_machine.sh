#!/bin/sh
# Builds sluice on a GPU machine that lacks the Debian -dev packages sluice
# builds with (liburing, isa-l, libarchive, jansson): they are carried unpacked with
# `dpkg -x` into .carry/uring and .carry/deps (see docs/BENCHMARKS.md).
# Source it: `. bench/gpu_machine.sh`; it exports LD_LIBRARY_PATH.
R=$(pwd)
for U in "$R/.carry/uring/usr" "$R/.carry/deps/usr"; do
	PC="$U/lib/x86_64-linux-gnu/pkgconfig"
	[ -d "$PC" ] || continue
	sed -i "s|=/usr|=$U|" "$PC"/*.pc
	PKG_CONFIG_PATH="$PC${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	LD_LIBRARY_PATH="$U/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export PKG_CONFIG_PATH LD_LIBRARY_PATH
rm -f build/CMakeCache.txt
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build >/dev/null || return 1
