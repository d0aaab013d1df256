#!/usr/bin/env bash
# tests/consumer/run.sh BUILD_DIR [EXTRA_CFLAGS] - install kvtier from BUILD_DIR into a temp
# prefix, build tests/consumer against that copy only (pkg-config: shared and static;
# find_package: kvtier::kvtier and kvtier::kvtier_static), check the installed files and the
# exported symbols, and run every consumer. EXTRA_CFLAGS (sanitizer builds) go to the consumers'
# compile and link. Exits 0 when all passes. Run by ctest as "consumer".
set -euo pipefail
build=$(cd "$1" && pwd)
extra=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name libkvtier.so.0 | head -1)")
for f in include/kvtier.h; do
	test -f "$prefix/$f" || { echo "consumer: $f not installed"; exit 1; }
done
for f in libkvtier.so libkvtier.a pkgconfig/kvtier.pc cmake/kvtier/kvtierConfig.cmake \
	cmake/kvtier/kvtierConfigVersion.cmake; do
	test -e "$libdir/$f" || { echo "consumer: $libdir/$f not installed"; exit 1; }
done
soname=$(objdump -p "$libdir/libkvtier.so" | awk '/SONAME/ { print $2 }')
[ "$soname" = libkvtier.so.0 ] || { echo "consumer: SONAME is '$soname'"; exit 1; }
"$here/../abi_check.sh" "$libdir/libkvtier.so" "$prefix/include/kvtier.h"

echo "consumer: pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion kvtier)" = "$(sed -n 's/^Version: //p' "$libdir/pkgconfig/kvtier.pc")" ]
make -s -C "$here" O="$tmp" CFLAGS="-O1 $extra" LDFLAGS="$extra"
if readelf -d "$tmp/consumer-pc-static" | grep -q 'libkvtier'; then
	echo "consumer: the static consumer needs libkvtier.so"; exit 1
fi

echo "consumer: find_package"
cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" >/dev/null
cmake --build "$tmp/cm" >/dev/null

for exe in "$tmp/consumer-pc" "$tmp/consumer-pc-static" "$tmp/cm/consumer" \
	"$tmp/cm/consumer_static"; do
	echo "consumer: run $(basename "$exe")"
	LD_LIBRARY_PATH=$libdir "$exe"
done
echo "consumer: all ok"
