#!/bin/sh
# The libraries the wheel bundles, built for glibc 2.28 (manylinux_2_28), once per machine.
#
#   scripts/wheel_deps.sh PYTHON      prints the directory made: PREFIX/{include,lib}, tc/zcc, licenses/
#
# A user's pip installs a manylinux_2_28 wheel only where every ELF file in it needs glibc 2.28 or older.
# Debian 12's own libraries bind glibc 2.36's symbol versions (and libarchive's xml2 brings ICU, which needs
# GCC 12's libstdc++), so they cannot be bundled.  Instead each is built here from its Debian 12 source
# package (the same upstream versions as a source build of sluice links, with Debian's patches), with zig's
# clang aimed at glibc 2.28 (`zig cc -target x86_64-linux-gnu.2.28`, zig from PyPI's ziglang): it links
# against stub libraries of exactly 2.28, so a configure test for a newer function fails (libarchive then
# does without arc4random_buf) and a newer symbol cannot link at all.  Features sluice does not use are
# left out (TLS in libmicrohttpd, LDAP/Kerberos/SSH in libcurl, XML and ACLs in libarchive), so the wheel
# bundles 16 libraries and no C++.  zlib and expat are built to link against; the wheel uses the system's
# (manylinux allows both).
#
# Cold: about 15 minutes on two cores and 150 MB of downloads; after that the cache answers at once.  The
# cache is $SLUICE_BUILD_CACHE (default /var/cache/sluice-build), outside the clone so that CI's fresh
# clones share it; its directory is named by a hash of this script, so a changed recipe builds anew.
set -e
PY="$1"
[ -n "$PY" ] || { echo "usage: scripts/wheel_deps.sh PYTHON" >&2; exit 2; }
self="$(cd "$(dirname "$0")" && pwd)/wheel_deps.sh"
CACHE="${SLUICE_BUILD_CACHE:-/var/cache/sluice-build}"
OUT="$CACHE/glibc2.28-$(sha256sum "$self" | cut -c1-12)"
[ -z "$SLUICE_WHEEL_DEPS_DIR" ] || OUT="$SLUICE_WHEEL_DEPS_DIR" # while changing this recipe: keep what built
[ -f "$OUT/done" ] && { echo "$OUT"; exit 0; }
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9 # one build at a time; a second waits and then finds the first's result
[ -f "$OUT/done" ] && { echo "$OUT"; exit 0; }
P="$OUT/prefix"
mkdir -p "$P/lib" "$P/include" "$OUT/tc" "$OUT/licenses"
log="$OUT/build.log"
say() { echo "wheel-deps: $*" >&2; }
fail() { say "$1 failed; the last lines of $log:"; tail -30 "$log" >&2; exit 1; }

# 1. zig, from PyPI.
ZIGV=0.17.1
zigdir="$CACHE/ziglang-$ZIGV"
if [ ! -x "$zigdir/ziglang/zig" ]; then
	say "ziglang $ZIGV from PyPI"
	rm -rf "$zigdir.tmp"
	"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$zigdir.tmp" "ziglang==$ZIGV"
	mv "$zigdir.tmp" "$zigdir"
fi
export ZIG_GLOBAL_CACHE_DIR="$CACHE/zig-cache" ZIG_LOCAL_CACHE_DIR="$CACHE/zig-cache"
# Baseline x86-64 as Debian builds (never the build machine's own CPU); no sanitizer traps (zig's default
# without -O).  A version query has no target: zig refuses a glibc version in the triple for it.
for t in cc c++; do
	cat >"$OUT/tc/z$t" <<EOF
#!/bin/sh
export ZIG_GLOBAL_CACHE_DIR="$CACHE/zig-cache" ZIG_LOCAL_CACHE_DIR="$CACHE/zig-cache"
for a; do case "\$a" in -v|--version|-qversion|-V) exec "$zigdir/ziglang/zig" $t "\$@";; esac; done
exec "$zigdir/ziglang/zig" $t -target x86_64-linux-gnu.2.28 -mcpu=x86_64 -fno-sanitize=undefined "\$@"
EOF
	chmod +x "$OUT/tc/z$t"
done
CC="$OUT/tc/zcc"
CXX="$OUT/tc/zc++"
# (No LD_LIBRARY_PATH here: this machine's cmake would load the OpenSSL built here.  configure's test programs
# get it, in ac.)
export CC CXX CFLAGS="-O2 -g0" CPPFLAGS="-I$P/include" LDFLAGS="-L$P/lib -Wl,-rpath-link,$P/lib" \
	PKG_CONFIG_LIBDIR="$P/lib/pkgconfig:$P/share/pkgconfig"
unset PKG_CONFIG_PATH

# 2. The sources: Debian 12's source packages (a list of our own; the machine's apt lists are not touched).
# Each line: source package, the binary package (and its soname's stem) the wheel's licence list names.
PKGS="zlib:- expat:- bzip2:libbz2-1.0:libbz2 xz-utils:liblzma5:liblzma lz4:liblz4-1:liblz4
libzstd:libzstd1:libzstd libisal:libisal2:libisal liburing:liburing2:liburing jansson:libjansson4:libjansson
openssl:libssl3:libssl,libcrypto nghttp2:libnghttp2-14:libnghttp2 curl:libcurl4:libcurl
libarchive:libarchive13:libarchive libmicrohttpd:libmicrohttpd12:libmicrohttpd
libjpeg-turbo:libjpeg62-turbo:libjpeg libpng1.6:libpng16-16:libpng16 libwebp:libwebp7:libwebp"
src="$CACHE/src-bookworm"
mkdir -p "$src/lists/partial"
printf 'deb-src http://deb.debian.org/debian bookworm main\n' >"$src/sources.list"
o="-o Dir::Etc::SourceList=$src/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$src/lists"
say "sources"
apt-get $o update -qq >>"$log" 2>&1 || fail "apt-get update"
for e in $PKGS; do
	s="${e%%:*}"
	[ -d "$src/$s" ] && continue
	(cd "$src" && rm -rf "$s.tmp" && mkdir "$s.tmp" && cd "$s.tmp" &&
		apt-get $o source -qq --download-only "$s" >>"$log" 2>&1 &&
		dpkg-source -q -x "$s"_*.dsc tree >>"$log" 2>&1 && mv tree "../$s" && cd .. && rm -rf "$s.tmp") ||
		fail "the source of $s"
done

J=-j"$(nproc)"
cm() { # a CMake project: cm DIR ARGS...
	d="$1"; shift
	cmake -S "$d" -B "$d/_b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$P" \
		-DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_FLAGS="$CFLAGS" \
		-DBUILD_SHARED_LIBS=ON "$@" >>"$log" 2>&1 && cmake --build "$d/_b" $J >>"$log" 2>&1 &&
		cmake --install "$d/_b" >>"$log" 2>&1
}
ac() { # an autoconf project in the current directory: ac ARGS...
	# Debian's patches leave configure.ac newer than what it generates: the generated files newest again, in
	# the order autotools makes them, so make does not ask for automake.
	for g in aclocal.m4 configure; do [ -f "$g" ] && touch "$g"; done
	find . \( -name Makefile.in -o -name "*config.h.in" \) -exec touch {} +
	LD_LIBRARY_PATH="$P/lib" ./configure --prefix="$P" --libdir="$P/lib" --disable-static "$@" >>"$log" 2>&1 &&
		make $J >>"$log" 2>&1 && make install >>"$log" 2>&1
}
build() { # build SOURCE-PACKAGE: the recipe of each, in a fresh copy of its tree (once: a stamp)
	[ -f "$OUT/built.$1" ] && return
	say "$1"
	rm -rf "$OUT/b/$1" && mkdir -p "$OUT/b" && cp -a "$src/$1" "$OUT/b/$1" && cd "$OUT/b/$1"
	echo "=== $1" >>"$log"
	case "$1" in
	zlib) # its configure knows how to link a shared library only from a gcc
		CFLAGS="$CFLAGS -fPIC" LDSHARED="$CC -shared -Wl,--undefined-version,-soname,libz.so.1,--version-script,zlib.map" \
			./configure --prefix="$P" --libdir="$P/lib" --shared >>"$log" 2>&1 && make $J >>"$log" 2>&1 &&
			make install >>"$log" 2>&1 ;;
	expat) cm "$([ -f expat/CMakeLists.txt ] && echo expat || echo .)" -DEXPAT_BUILD_TOOLS=OFF -DEXPAT_BUILD_EXAMPLES=OFF -DEXPAT_BUILD_TESTS=OFF \
		-DEXPAT_BUILD_DOCS=OFF -DEXPAT_BUILD_PKGCONFIG=ON -DEXPAT_DTD=OFF ;; # DTDs: unused, and broken by a Debian patch under CMake
	bzip2) make -f Makefile-libbz2_so CC="$CC" CFLAGS="$CFLAGS -fPIC -D_FILE_OFFSET_BITS=64" >>"$log" 2>&1 &&
		cp bzlib.h "$P/include/" && cp libbz2.so.1.0.* "$P/lib/" &&
		(cd "$P/lib" && ln -sf libbz2.so.1.0.* libbz2.so.1.0 && ln -sf libbz2.so.1.0 libbz2.so) ;;
	xz-utils) ac --disable-xz --disable-xzdec --disable-lzmadec --disable-lzmainfo --disable-lzma-links \
		--disable-scripts --disable-doc --disable-nls ;;
	lz4) make -C lib $J CC="$CC" liblz4 >>"$log" 2>&1 &&
		make -C lib install PREFIX="$P" LIBDIR="$P/lib" BUILD_STATIC=no >>"$log" 2>&1 ;;
	libzstd) make -C lib $J CC="$CC" libzstd >>"$log" 2>&1 &&
		make -C lib install-pc install-includes install-shared PREFIX="$P" LIBDIR="$P/lib" >>"$log" 2>&1 ;;
	libisal) make -f Makefile.unx $J CC="$CC" units=crc slib >>"$log" 2>&1 &&
		mkdir -p "$P/include/isa-l" && cp include/*.h "$P/include/isa-l/" &&
		cp bin/libisal.so "$P/lib/libisal.so.2" && ln -sf libisal.so.2 "$P/lib/libisal.so" &&
		v="$(sed -n 's/^version *= *//p' Makefile.unx | head -1)" &&
		printf 'prefix=%s\nlibdir=${prefix}/lib\nincludedir=${prefix}/include\n\nName: libisal\nDescription: isa-l (crc)\nVersion: %s\nLibs: -L${libdir} -lisal\nCflags: -I${includedir}\n' \
			"$P" "${v:-2.30.0}" >"$P/lib/pkgconfig/libisal.pc" ;;
	liburing) # its Makefile names objects .os, a suffix zig hands to clang with the target's glibc version
		sed -i 's/\.os\b/.pic.o/g' src/Makefile &&
		./configure --prefix="$P" --libdir="$P/lib" --libdevdir="$P/lib" --cc="$CC" >>"$log" 2>&1 &&
		make -C src $J >>"$log" 2>&1 && make install >>"$log" 2>&1 ;;
	jansson) cm . -DJANSSON_BUILD_SHARED_LIBS=ON -DJANSSON_BUILD_DOCS=OFF -DJANSSON_WITHOUT_TESTS=ON \
		-DJANSSON_EXAMPLES=OFF ;;
	openssl) # no module or engine ships with it: their directories name no path of this machine (a provider
		# that a system's openssl.cnf asks for then fails to load, never one found here); OPENSSL_MODULES
		# still points it at a directory of the user's
		./Configure linux-x86_64 shared no-tests no-engine no-legacy --prefix="$P" --libdir=lib \
		--openssldir=/etc/ssl CC="$CC" >>"$log" 2>&1 &&
		make $J build_libs MODULESDIR=/nonexistent/ossl-modules ENGINESDIR=/nonexistent/engines-3 >>"$log" 2>&1 &&
		make install_dev MODULESDIR=/nonexistent/ossl-modules ENGINESDIR=/nonexistent/engines-3 >>"$log" 2>&1 &&
		! grep -aq "MODULESDIR: \"$CACHE" "$P/lib/libcrypto.so.3" ;;
	nghttp2) cm . -DENABLE_LIB_ONLY=ON -DENABLE_STATIC_LIB=OFF -DENABLE_SHARED_LIB=ON ;;
	curl) ac --with-openssl="$P" --with-nghttp2="$P" --with-zlib="$P" --without-libpsl --without-libidn2 \
		--without-librtmp --without-libssh2 --without-gssapi --without-brotli --without-zstd --disable-ldap \
		--disable-ldaps --disable-manual --disable-dict --disable-telnet --disable-tftp --disable-pop3 \
		--disable-imap --disable-smtp --disable-gopher --disable-mqtt --disable-rtsp --disable-smb \
		--without-ca-bundle --without-ca-path --with-ca-fallback ;;
	libarchive) ac --without-xml2 --without-expat --without-openssl --without-nettle --without-mbedtls \
		--without-lzo2 --without-libb2 --without-cng --disable-acl --disable-xattr --disable-bsdtar \
		--disable-bsdcpio --disable-bsdcat --with-zlib --with-bz2lib --with-lzma --with-zstd --with-lz4 &&
		sed -i 's/ *\biconv\b//' "$P/lib/pkgconfig/libarchive.pc" ;; # glibc's iconv, no iconv.pc
	libmicrohttpd) ac --disable-https --without-gnutls --disable-doc --disable-examples --disable-curl ;;
	libjpeg-turbo) cm . -DCMAKE_INSTALL_LIBDIR="$P/lib" -DWITH_JPEG8=OFF -DENABLE_STATIC=OFF -DWITH_TURBOJPEG=OFF -DCMAKE_ASM_NASM_COMPILER=nasm ;;
	libpng1.6) ac ;;
	libwebp) ac --disable-libwebpmux --disable-libwebpdemux --disable-libwebpdecoder --disable-png \
		--disable-jpeg --disable-tiff --disable-gif --disable-wic --disable-gl --disable-sdl ;;
	esac || fail "$1"
	cd "$OUT" && touch "built.$1"
}
for e in $PKGS; do build "${e%%:*}"; done
find "$P" -name "*.a" -delete
rm -rf "$OUT/b" "$OUT/licenses"/*
mkdir -p "$OUT/licenses"

# 3. The check that makes this worth it: no library here needs a glibc newer than 2.28, or any libstdc++.
for f in "$P"/lib/*.so*; do
	[ -L "$f" ] && continue
	v="$(objdump -T "$f" | grep -o 'GLIBC_2\.[0-9.]*' | sort -uV | tail -1)"
	case "$v" in GLIBC_2.29*|GLIBC_2.[3-9]*) say "$f needs $v"; exit 1 ;; esac
	! objdump -T "$f" | grep -q 'GLIBCXX\|CXXABI' || { say "$f needs libstdc++"; exit 1; }
done

# 4. Licences: each bundled package's debian/copyright, named by its binary package, and the map from a
# library's soname stem to it (scripts/wheel.sh checks every bundled library has one).
for e in $PKGS; do
	s="${e%%:*}" rest="${e#*:}"
	[ "$rest" = - ] && continue
	bin="${rest%%:*}" stems="${rest#*:}"
	cp "$src/$s/debian/copyright" "$OUT/licenses/$bin"
	ver="$(dpkg-parsechangelog -l "$src/$s/debian/changelog" -S Version)"
	for st in $(echo "$stems" | tr , ' '); do echo "$st $bin $ver" >>"$OUT/licenses/stems"; done
done
touch "$OUT/done"
say "ready: $OUT"
echo "$OUT"
