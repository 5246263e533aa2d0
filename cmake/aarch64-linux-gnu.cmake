# Toolchain file for a cross build for 64-bit ARM Linux from an x86-64 Debian or Ubuntu host
# (packages gcc-aarch64-linux-gnu and qemu-user): `make test-aarch64` uses it. Tests that CMake runs
# as programs go through qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR); the library gets the
# portable kernels, as on any CPU that is not x86.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
