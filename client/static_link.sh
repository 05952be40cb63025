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

# Prints a copy of protobuf's archive $1 whose well-known-type files (descriptor.proto,
# timestamp.proto, ...) add their descriptors to the generated pool on first use instead of at
# program start, or $1 itself when the archive does not look as expected.
#
# Why: protobuf 3.21 parses each linked .proto file's whole FileDescriptorProto at start to index
# its symbols. Loom's own generated files no longer do (proto/lazy_descriptors.cmake); the files
# inside libprotobuf.a still did (six are linked into loomctl), 0.68 M of the 1.27 M instructions
# of a `loomctl get` (callgrind).
# Each such member (NAME.pb.o) has one initializer of priority 102 whose only work is
# `AddDescriptorsRunner(&descriptor_table_...)`; removing its .init_array.00102 section (objcopy
# drops the section's relocations with it) leaves the file to be added by AssignDescriptors, as
# for Loom's files. The initializers of priority 101 (default instances' destructors) and the
# rest stay. tests/client/CMakeLists.txt checks the linked loomctl's initializers.
lazy_protobuf_archive() {
  local src=$1 dir=$PWD/protobuf_lazy_descriptors
  local out=$dir/libprotobuf.a
  if [ "$out" -nt "$src" ] && [ "$out" -nt "$0" ]; then
    echo "$out"
    return
  fi
  local work members
  members=$(ar t "$src")
  work=$(mktemp -d "${TMPDIR:-/tmp}/loomctl-protobuf-XXXXXX")
  # Members are extracted by position: `ar x` of an archive with two members of one name would
  # keep only the last. Debian's libprotobuf.a has unique names; a duplicate falls back.
  if ! (cd "$work" && ar x "$src") 2>/dev/null || [ -n "$(sort <<<"$members" | uniq -d)" ]; then
    rm -rf "$work"
    echo "$src"
    return
  fi
  local member changed=0
  for member in $members; do
    case "$member" in *.pb.o) ;; *) continue ;; esac
    # Whole outputs, then grep: under pipefail, `readelf | grep -q` fails when grep stops early.
    local sections symbols relocations
    sections=$(readelf -SW "$work/$member")
    symbols=$(nm "$work/$member")
    relocations=$(readelf -rW "$work/$member")
    grep -q ' \.init_array\.00102 ' <<<"$sections" || continue
    # Only a member that runs protobuf's AddDescriptorsRunner, and nothing else at priority 102.
    grep -q ' U .*AddDescriptorsRunnerC1' <<<"$symbols" || continue
    [ "$(grep -A3 "'\.rela\.init_array\.00102'" <<<"$relocations" | grep -c R_X86_64_64)" = 1 ] ||
      continue
    objcopy -R .init_array.00102 "$work/$member" && changed=$((changed + 1))
  done
  if [ "$changed" -lt 1 ] || ! grep -qx descriptor.pb.o <<<"$members"; then
    echo "static_link.sh: $src does not look like protobuf 3.21's archive; loomctl keeps its" \
      "eager descriptors" >&2
    rm -rf "$work"
    echo "$src"
    return
  fi
  mkdir -p "$dir"
  (cd "$work" && ar rcs "$out.tmp" $members) && mv "$out.tmp" "$out"
  rm -rf "$work"
  echo "$out"
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
  case "$replacement" in */libprotobuf.a) replacement=$(lazy_protobuf_archive "$replacement") ;; esac
  cmd+=("${replacement:-$arg}")
done
[ "$after_output" = 1 ] && cmd+=(-Wl,--end-group)
exec "${cmd[@]}"
