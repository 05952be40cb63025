#!/usr/bin/env python3
"""Checks what runs before main() in the loomctl that client/static_link.sh linked.

usage: loomctl_initializers_test.py LOOMCTL EXAMPLES_DIR

protobuf 3.21 adds every linked .proto file's descriptor to its generated pool at program start
(an initializer of priority 102 per file, `_GLOBAL__sub_I.00102_...`). Loom's generated files
lose theirs in proto/lazy_descriptors.cmake; the well-known-type files inside libprotobuf.a
(descriptor.proto, timestamp.proto, ...) lose theirs in static_link.sh. This test reads the
executable's .init_array, names each entry from the symbol table, and fails when any priority-102
initializer is left. So that the check cannot pass by reading nothing, the same table must name
protobuf's priority-101 initializers, which stay (they register the default instances'
destructors). Then it runs the commands whose output needs the descriptors (JSON of a plan,
built by reflection, from a spec parsed from YAML through JSON) and checks what they print.

static_link.sh also links glibc statically and removes libcrypto's CPUID probe from .init (it
runs at OpenSSL's initialisation instead). So this test also fails when loomctl has a program
interpreter (the dynamic loader: a fallback link happened) or when its .init section calls
OPENSSL_cpuid_setup, which must be in the symbol table (so the check cannot pass by finding
nothing to check). The static loomctl finds its unwinding tables through its PT_GNU_EH_FRAME
header instead of libgcc's frame registry (client/static_eh_frames.cc), so the test requires
that header and throws exceptions in loomctl (--help and a bad flag are CLI11 exceptions; a
YAML syntax error is yaml-cpp's) and checks each is caught and reported.
"""
import json
import os
import struct
import subprocess
import sys


def elf_sections(data):
    """Returns {name: (addr, offset, size, link)} of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit("not an ELF64 little-endian file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        name, _type, _flags, addr, offset, size, link = struct.unpack_from(
            "<IIQQQQI", data, shoff + i * shentsize)
        headers.append((name, addr, offset, size, link))
    names_offset = headers[shstrndx][2]
    sections = {}
    for index, (name, addr, offset, size, link) in enumerate(headers):
        end = data.index(b"\0", names_offset + name)
        sections[data[names_offset + name:end].decode()] = (addr, offset, size, link, index)
    return sections, headers


def symbols_by_address(data, sections, headers):
    if ".symtab" not in sections:
        raise SystemExit("loomctl has no symbol table (stripped?): cannot name its initializers")
    _, offset, size, link, _ = sections[".symtab"]
    strtab_offset = headers[link][2]
    names = {}
    for entry in range(offset, offset + size, 24):
        name, info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, entry)
        if value == 0 or (info & 0xF) != 2:  # STT_FUNC only
            continue
        end = data.index(b"\0", strtab_offset + name)
        names.setdefault(value, data[strtab_offset + name:end].decode(errors="replace"))
    return names


PT_INTERP, PT_GNU_EH_FRAME = 3, 0x6474E550


def program_headers(data):
    """{p_type: (p_offset, p_filesz)} of an ELF64 executable's program headers."""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    headers = {}
    for i in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        headers.setdefault(p_type, (p_offset, p_filesz))
    return headers


def init_calls(data, sections):
    """Targets of the direct calls (E8 rel32) in the .init section."""
    address, offset, size, _, _ = sections[".init"]
    code = data[offset:offset + size]
    targets = []
    for i in range(len(code) - 4):
        if code[i] == 0xE8:
            rel, = struct.unpack_from("<i", code, i + 1)
            targets.append(address + i + 5 + rel)
    return targets


def main():
    loomctl, examples = sys.argv[1], sys.argv[2]
    with open(loomctl, "rb") as f:
        data = f.read()
    sections, headers = elf_sections(data)
    names = symbols_by_address(data, sections, headers)
    _, offset, size, _, _ = sections[".init_array"]
    entries = [struct.unpack_from("<Q", data, offset + i)[0] for i in range(0, size, 8)]
    named = [names.get(address, hex(address)) for address in entries]

    eager = [n for n in named if n.startswith("_GLOBAL__sub_I.00102_")]
    kept = [n for n in named if n.startswith("_GLOBAL__sub_I.00101_") and "protobuf" in n]
    print(f"{len(entries)} initializers; {len(kept)} of protobuf's priority 101; "
          f"{len(eager)} of priority 102")
    failed = False
    if eager:
        print("FAIL: descriptors still added at start by:\n  " + "\n  ".join(eager))
        failed = True
    if len(kept) < 5:
        print("FAIL: protobuf's well-known-type files' priority-101 initializers not found "
              "(the symbol lookup or the link changed); the check above proves nothing")
        failed = True

    segments = program_headers(data)
    if PT_INTERP in segments:
        offset, size = segments[PT_INTERP]
        interpreter = data[offset:offset + size].rstrip(b"\0").decode(errors="replace")
        print(f"FAIL: loomctl is linked dynamically (interpreter {interpreter}): static_link.sh "
              "fell back to a shared glibc; its warning in the build output says why")
        failed = True
    cpuid_setup = [a for a, n in names.items() if n == "OPENSSL_cpuid_setup"]
    if not cpuid_setup:
        print("FAIL: OPENSSL_cpuid_setup is not in loomctl's symbol table; the .init check "
              "below proves nothing")
        failed = True
    elif cpuid_setup[0] in init_calls(data, sections):
        print("FAIL: loomctl's .init still calls OPENSSL_cpuid_setup (a CPUID probe before main)")
        failed = True

    if PT_GNU_EH_FRAME not in segments:
        print("FAIL: loomctl has no PT_GNU_EH_FRAME header: with the frame registry bypassed, "
              "no exception could be unwound")
        failed = True
    bad_yaml = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"loomctl-bad-{os.getpid()}.yaml")
    with open(bad_yaml, "w") as f:
        f.write("name: [unclosed\n")
    try:
        for args, code, needle in (
                (["--help"], 0, "Usage:"),
                (["list", "--no-such-flag"], 2, "--no-such-flag"),
                (["plan", "-f", bad_yaml, "--cluster",
                  os.path.join(examples, "cluster-h100.yaml")], 2, "YAML syntax error")):
            run = subprocess.run([loomctl] + args, capture_output=True, text=True, timeout=60)
            if run.returncode != code or needle not in run.stdout + run.stderr:
                print(f"FAIL: loomctl {' '.join(args)} exited {run.returncode} (want {code}) "
                      f"without {needle!r}: {(run.stdout + run.stderr).strip()[:300]}")
                failed = True
    finally:
        os.unlink(bad_yaml)

    # The descriptors on first use: a plan printed as JSON (reflection over Loom's messages and
    # their imports), from a spec read as YAML -> JSON -> message.
    plan = subprocess.run(
        [loomctl, "-o", "json", "plan", "-f", os.path.join(examples, "gpt2-1.5b.yaml"),
         "--cluster", os.path.join(examples, "cluster-h100.yaml"), "--top", "2"],
        capture_output=True, text=True, timeout=60)
    if plan.returncode != 0:
        print(f"FAIL: loomctl plan exited {plan.returncode}: {plan.stderr.strip()}")
        failed = True
    else:
        plans = json.loads(plan.stdout).get("plans", [])
        if len(plans) != 2 or "layout" not in plans[0] or "memory" not in plans[0]:
            print("FAIL: loomctl -o json plan printed an unexpected document:\n" + plan.stdout)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
