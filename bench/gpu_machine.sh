#!/bin/sh
# Sets sluice up on a GPU machine, which reaches no package registry, from
# what bench/prepare_gpu_machine.sh made here and the device tool carries.
# Source it: `. bench/gpu_machine.sh`.
#
#   build/wheelhouse  the wheel (make wheel): installed into /tmp/sluice-wheel,
#                     put first on PYTHONPATH and PATH, so `import sluice` and
#                     `sluice` are the wheel's, with its bundled libraries
#   .carry/deps       Debian's -dev packages: only to build from source (the C
#                     test binaries, build/sluice, build/libsluice.so); it
#                     exports LD_LIBRARY_PATH for them
#   .whl              the peers' wheels, installed once into /tmp/site, on PYTHONPATH
#
# Without a carried wheel, the Python package runs from python/ against the
# source build (SLUICE_LIB=build/libsluice.so).
U="$(pwd)/.carry/deps/usr"
if [ -d .whl ] && [ ! -d /tmp/site ]; then
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
		echo "gpu_machine: the carried wheels did not install" >&2
fi
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
whl="$(ls build/wheelhouse/sluice-*.whl 2>/dev/null | head -n 1)"
if [ -n "$whl" ]; then
	[ -d /tmp/sluice-wheel ] || python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/sluice-wheel "$whl" ||
		{ echo "gpu_machine: $whl did not install" >&2; return 1; }
	export PYTHONPATH="/tmp/sluice-wheel${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/sluice-wheel/bin:$PATH"
	unset SLUICE_LIB
fi
if [ -d "$U/lib/x86_64-linux-gnu/pkgconfig" ]; then
	sed -i "s|=/usr|=$U|" "$U"/lib/x86_64-linux-gnu/pkgconfig/*.pc # once: =$U no longer matches
	export PKG_CONFIG_PATH="$U/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	export LD_LIBRARY_PATH="$U/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	rm -f build/CMakeCache.txt
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build >/dev/null || return 1
elif [ -z "$whl" ]; then
	echo "gpu_machine: neither a wheel (build/wheelhouse) nor .carry/deps was carried" >&2
	return 1
fi
