#!/bin/sh
# Installs the build into a temporary prefix, then builds a program outside the project against the
# installed copy three ways: CMake's find_package(attn) (shared and static) and pkg-config.
# usage: install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER LIBDIR [EXTRA_FLAGS]
# EXTRA_FLAGS (e.g. -fsanitize=address) are what a library built with sanitizers needs from users.
set -eu
build="$1"
src="$2"
cc="$3"
libdir="$4"
extra="${5:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
for f in include/attn.h $libdir/libattn.a $libdir/pkgconfig/attn.pc $libdir/cmake/attn/attnConfig.cmake; do
    [ -e "$tmp/prefix/$f" ] || { echo "missing after install: $f"; ls -R "$tmp/prefix"; exit 1; }
done
ls "$tmp/prefix/$libdir"/libattn.so* > /dev/null
cmake -S "$src/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" > /dev/null
cmake --build "$tmp/consumer" > /dev/null
LD_LIBRARY_PATH="$tmp/prefix/$libdir" "$tmp/consumer/consumer_shared"
"$tmp/consumer/consumer_static"
if command -v pkg-config > /dev/null; then
    flags=$(PKG_CONFIG_PATH="$tmp/prefix/$libdir/pkgconfig" pkg-config --cflags --libs attn)
    "$cc" $extra "$src/tests/consumer/main.c" -o "$tmp/consumer_pc" $flags
    LD_LIBRARY_PATH="$tmp/prefix/$libdir" "$tmp/consumer_pc"
    # static: the archive itself plus the private libraries pkg-config --static lists
    cflags=$(PKG_CONFIG_PATH="$tmp/prefix/$libdir/pkgconfig" pkg-config --cflags attn)
    private=$(PKG_CONFIG_PATH="$tmp/prefix/$libdir/pkgconfig" pkg-config --static --libs-only-l attn | sed 's/-lattn//')
    "$cc" $extra "$src/tests/consumer/main.c" -o "$tmp/consumer_pc_static" $cflags "$tmp/prefix/$libdir/libattn.a" $private
    "$tmp/consumer_pc_static"
else
    echo "pkg-config not found: the pkg-config build was not tried"
fi
echo "the installed library works through find_package and pkg-config"
