#!/usr/bin/env bash
# Link launcher for loomctl (client/CMakeLists.txt sets it as the target's RULE_LAUNCH_LINK): runs
# the link command CMake wrote, with every shared library that has a static archive next to it
# (gRPC, protobuf, Abseil, yaml-cpp, OpenSSL, c-ares, re2, zlib, upb, nghttp2: Debian ships the
# .a files in the -dev packages) replaced by that archive, libstdc++ and libgcc linked statically, and a
# position-dependent executable (-no-pie: no start-up relocation of the binary's own pointers).
# glibc is linked statically too (-static) when the whole program links that way; otherwise (a
# library loomctl needs has no archive) it stays shared, with a warning. A library without a .a
# that loomctl does not use is left out of the static link (a shared link would drop it too).
#
# Why: a CLI call is dominated by the dynamic loader when ~58 shared libraries with ~15,700
# relocations are mapped (about 25 ms per `loomctl` on a 2-core machine); the archives made it
# ~3 ms. With glibc shared the loader still mapped libc and libm and resolved their symbols on
# every call; statically, a `loomctl list` went from 1.10-1.59 to 0.81-0.87 ms of CPU and from
# 170 to 130 page faults (perf stat, 200 calls each, 2-core VM).
#
# What a static glibc means for loomctl: host names are resolved by the "files" and "dns" sources
# of /etc/nsswitch.conf, which are built into glibc; any other source (mdns, myhostname,
# resolve) is loaded at run time from the system's glibc, which must then be the version
# loomctl was linked with (Debian's security updates keep it), so rebuild loomctl after a
# distribution upgrade. The linker says as much about getaddrinfo and dlopen; those warnings are
# filtered from the build's output below.
#
# A static program would also register its unwinding tables with libgcc at start, which makes
# the first exception sort every FDE of the program (12 ms for loomctl; CLI11 throws for --help
# and every bad flag); the static link bypasses that registry (client/static_eh_frames.cc).
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

# Prints a copy of OpenSSL's archive $1 whose CPU-feature probe runs when OpenSSL is first
# initialised instead of at program start, or $1 itself when the archive does not look as
# expected.
#
# Why: libcrypto's x86_64cpuid.o puts `call OPENSSL_cpuid_setup` into the .init section, so every
# program linked with it runs OpenSSL's CPUID probe before main, TLS or not. In a virtual machine
# each CPUID instruction traps to the hypervisor (4.5-8 us each on this project's VMs): 2.4 % of
# a plaintext `loomctl` call's samples in a storm were OPENSSL_ia32_cpuid. OpenSSL 3 runs the same probe
# in OPENSSL_init_crypto (ossl_init_base), which every TLS path calls before any cipher, so
# without the .init entry the probe happens exactly when TLS is used. (A libcrypto function
# called before any initialisation would see no CPU features and take its portable code path:
# slower, never wrong.) Only a member whose whole .init is that one call is changed.
crypto_archive_without_cpuid_init() {
  local src=$1 dir=$PWD/crypto_lazy_cpuid member=libcrypto-lib-x86_64cpuid.o
  local out=$dir/libcrypto.a
  if [ "$out" -nt "$src" ] && [ "$out" -nt "$0" ]; then
    echo "$out"
    return
  fi
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/loomctl-crypto-XXXXXX")
  local sections="" relocations=""
  if [ "$(ar t "$src" | grep -cx "$member")" = 1 ] && (cd "$work" && ar x "$src" "$member"); then
    sections=$(readelf -SW "$work/$member")
    relocations=$(readelf -rW "$work/$member")
  fi
  # .init is 5 bytes (one call) and its one relocation names OPENSSL_cpuid_setup.
  if grep -Eq ' \.init +PROGBITS +[0-9a-f]+ [0-9a-f]+ 000005 ' <<<"$sections" &&
    [ "$(grep -A3 "'\.rela\.init'" <<<"$relocations" | grep -c 'OPENSSL_cpuid_setup')" = 1 ] &&
    objcopy -R .init "$work/$member"; then
    mkdir -p "$dir"
    cp "$src" "$out.tmp" && (cd "$work" && ar rs "$out.tmp" "$member") && mv "$out.tmp" "$out"
    rm -rf "$work"
    echo "$out"
    return
  fi
  echo "static_link.sh: $src does not look like OpenSSL 3's archive; loomctl keeps its" \
    "CPUID probe at start" >&2
  rm -rf "$work"
  echo "$src"
}

# The command is `c++ FLAGS OBJECTS -o OUTPUT LIBRARIES...`; libraries are swapped in place and
# put in one group: CMake's order assumed shared libraries, which resolve symbols in any order,
# and archives need a group for the same. Two commands are built: `static` (glibc too; shared
# libraries without an archive left out) and `mixed` (glibc and those libraries shared).
static=()
mixed=()
after_output=0
expect_output=0
for arg in "$@"; do
  if [ "$expect_output" = 1 ]; then
    flags=(-no-pie -static-libstdc++ -static-libgcc -Wl,-O1 -Wl,--start-group)
    # The unwinder's frame registry bypassed: client/static_eh_frames.cc says why.
    static+=("$arg" -static -Wl,--eh-frame-hdr -Wl,--wrap=__register_frame_info
      -Wl,--wrap=__deregister_frame_info "${flags[@]}")
    mixed+=("$arg" "${flags[@]}")
    expect_output=0
    after_output=1
    continue
  fi
  if [ "$arg" = -o ] && [ "$after_output" = 0 ]; then
    static+=("$arg")
    mixed+=("$arg")
    expect_output=1
    continue
  fi
  shared=0
  case "$arg" in
    -lc | -lm | -ldl | -lrt | -lpthread | -latomic) replacement= ;;
    *)
      replacement=$(static_of "$arg")
      case "$arg" in -l* | */lib*.so | */lib*.so.*) shared=1 ;; esac
      ;;
  esac
  case "$replacement" in
    */libprotobuf.a) replacement=$(lazy_protobuf_archive "$replacement") ;;
    */libcrypto.a) replacement=$(crypto_archive_without_cpuid_init "$replacement") ;;
  esac
  mixed+=("${replacement:-$arg}")
  if [ -n "$replacement" ] || [ "$shared" = 0 ]; then static+=("${replacement:-$arg}"); fi
done
if [ "$after_output" = 1 ]; then
  static+=(-Wl,--end-group)
  mixed+=(-Wl,--end-group)
fi
[ "$after_output" = 1 ] || exec "$@"  # not a link command we understand: run it as written

# glibc's warnings about static NSS and dlopen (explained at the top) are dropped; every other
# line of the linker's output is kept.
glibc_note='in statically linked applications requires at runtime the shared libraries from the glibc'
log=$(mktemp "${TMPDIR:-/tmp}/loomctl-link-XXXXXX")
if "${static[@]}" 2>"$log"; then
  # Each note follows a line naming the function that uses the call; both go.
  awk -v note="$glibc_note" 'index($0, note) { held = ""; next }
    { if (held != "") print held; held = $0 } END { if (held != "") print held }' "$log" >&2
  rm -f "$log"
  exit 0
fi
echo "static_link.sh: a fully static loomctl did not link; linking it with glibc shared:" >&2
grep -v -e "$glibc_note" "$log" | tail -5 >&2 || true  # the reason, without the notes
rm -f "$log"
exec "${mixed[@]}"
