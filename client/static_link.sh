#!/usr/bin/env bash
# Link launcher for loomctl (client/CMakeLists.txt sets it as the target's RULE_LAUNCH_LINK): runs
# the link command CMake wrote, with every shared library that has a static archive next to it
# (gRPC, protobuf, Abseil, yaml-cpp, OpenSSL, c-ares, re2, zlib, upb, nghttp2: Debian ships the
# .a files in the -dev packages) replaced by that archive, libstdc++ and libgcc linked statically, and a
# position-dependent executable (-no-pie: no start-up relocation of the binary's own pointers).
# glibc (libc, libm, libdl, librt, libpthread) stays shared: a static glibc cannot use NSS, and
# it costs the loader almost nothing. A library without a .a stays as it was, so the link never
# fails because of this script; it is only slower to start.
#
# Why: a CLI call is dominated by the dynamic loader when ~58 shared libraries with ~15,700
# relocations are mapped (about 25 ms per `loomctl` on a 2-core machine); this makes it ~3 ms.
set -euo pipefail

static_of() {  # prints the .a for a shared library path or -l flag, or nothing
  local arg=$1 dir base
  case "$arg" in
    -l*)
      base=${arg#-l}
      for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib /usr/local/lib; do
        if [ -f "$dir/lib$base.a" ]; then
          echo "$dir/lib$base.a"
          return
        fi
      done
      ;;
    */lib*.so | */lib*.so.*)
      base=${arg%%.so*}
      [ -f "$base.a" ] && echo "$base.a"
      ;;
  esac
  return 0
}

# The command is `c++ FLAGS OBJECTS -o OUTPUT LIBRARIES...`; libraries are swapped in place and
# put in one group: CMake's order assumed shared libraries, which resolve symbols in any order,
# and archives need a group for the same.
cmd=()
after_output=0
expect_output=0
for arg in "$@"; do
  if [ "$expect_output" = 1 ]; then
    cmd+=("$arg" -no-pie -static-libstdc++ -static-libgcc -Wl,-O1 -Wl,--start-group)
    expect_output=0
    after_output=1
    continue
  fi
  if [ "$arg" = -o ] && [ "$after_output" = 0 ]; then
    cmd+=("$arg")
    expect_output=1
    continue
  fi
  case "$arg" in
    -lc | -lm | -ldl | -lrt | -lpthread | -latomic) replacement= ;;
    *) replacement=$(static_of "$arg") ;;
  esac
  cmd+=("${replacement:-$arg}")
done
[ "$after_output" = 1 ] && cmd+=(-Wl,--end-group)
exec "${cmd[@]}"
