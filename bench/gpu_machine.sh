#!/bin/sh
# Builds sluice on a GPU machine that lacks the Debian -dev packages sluice
# builds with: bench/prepare_gpu_machine.sh unpacks them into .carry/deps
# here, and the device tool carries them.  Source it: `. bench/gpu_machine.sh`;
# it exports LD_LIBRARY_PATH, and installs the carried wheels (.whl) once
# into /tmp/site, on PYTHONPATH.
U="$(pwd)/.carry/deps/usr"
if [ -d "$U/lib/x86_64-linux-gnu/pkgconfig" ]; then
	sed -i "s|=/usr|=$U|" "$U"/lib/x86_64-linux-gnu/pkgconfig/*.pc # once: =$U no longer matches
	export PKG_CONFIG_PATH="$U/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	export LD_LIBRARY_PATH="$U/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -d .whl ] && [ ! -d /tmp/site ]; then
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
		echo "gpu_machine: the carried wheels did not install" >&2
fi
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
rm -f build/CMakeCache.txt
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build >/dev/null || return 1
