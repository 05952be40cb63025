#!/usr/bin/env python3
"""Writes docs/api-reference.md from the comments of proto/loom/v1/*.proto.

Loom's .proto files put the documentation in `//` comments: the lines just above a service,
rpc, message, enum, field or enum value, or a comment at the end of its line. This reads them
with a small parser of the subset of proto3 that Loom uses (no protoc plugin is packaged in
Debian), and renders one section per file: services with their RPCs, then messages (a table of
fields) and enums (a table of values), in file order.

  scripts/api_reference.py            rewrite docs/api-reference.md
  scripts/api_reference.py --check    exit 1 if docs/api-reference.md is not up to date
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROTO_DIR = os.path.join(ROOT, "proto", "loom", "v1")
OUT = os.path.join(ROOT, "docs", "api-reference.md")

FIELD = re.compile(r"^(?:(repeated|optional)\s+)?(map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+)")
ENUM_VALUE = re.compile(r"^(\w+)\s*=\s*(-?\d+)")
RPC = re.compile(r"^rpc\s+(\w+)\s*\(\s*(stream\s+)?([\w.]+)\s*\)\s*returns\s*\(\s*(stream\s+)?"
                 r"([\w.]+)\s*\)")
BLOCK = re.compile(r"^(message|enum|service|oneof)\s+(\w+)\s*\{")


def split_comment(line):
    """(code, trailing comment) of one line; `//` inside a string is not a comment."""
    in_string = False
    for i, c in enumerate(line):
        if c == '"':
            in_string = not in_string
        elif not in_string and line.startswith("//", i):
            return line[:i].strip(), line[i + 2:].strip()
    return line.strip(), ""


def parse(path):
    """A list of top-level items: dicts with kind, name, doc, and members / fields / values."""
    items, stack, pending = [], [], []
    with open(path) as fh:
        lines = fh.read().splitlines()
    for raw in lines:
        code, comment = split_comment(raw)
        if not code:
            if comment and raw.strip().startswith("//"):
                pending.append(comment)
            else:
                pending = []  # a blank line ends a comment that belongs to nothing below
            continue
        doc = " ".join(pending + ([comment] if comment else []))
        pending = []
        m = BLOCK.match(code)
        if m:
            kind, name = m.groups()
            node = {"kind": kind, "name": name, "doc": doc, "fields": [], "values": [],
                    "rpcs": [], "nested": []}
            if kind == "oneof":
                node["parent"] = stack[-1]
            elif stack:
                stack[-1]["nested"].append(node)
                node["name"] = stack[-1]["name"] + "." + name
            else:
                items.append(node)
            stack.append(node)
            if code.rstrip().endswith("}"):
                stack.pop()
            continue
        if code.startswith("}"):
            if stack:
                stack.pop()
            continue
        if not stack:
            continue  # syntax, package, import, option
        top = stack[-1]
        if top["kind"] == "service":
            m = RPC.match(code)
            if m:
                top["rpcs"].append({"name": m.group(1), "request": (m.group(2) or "") + m.group(3),
                                    "response": (m.group(4) or "") + m.group(5), "doc": doc})
            continue
        if top["kind"] == "enum":
            m = ENUM_VALUE.match(code)
            if m:
                top["values"].append({"name": m.group(1), "number": m.group(2), "doc": doc})
            continue
        m = FIELD.match(code)
        if m:
            label, typ, name, number = m.groups()
            owner = top["parent"] if top["kind"] == "oneof" else top
            if top["kind"] == "oneof":
                label = "oneof " + top["name"]
            owner["fields"].append({"label": label or "", "type": typ, "name": name,
                                    "number": number, "doc": doc})
    return items


def cell(text):
    return text.replace("|", "\\|") if text else ""


def render_type(node, out):
    if node["kind"] == "message":
        out.append("### %s\n" % node["name"])
        if node["doc"]:
            out.append(node["doc"] + "\n")
        if node["fields"]:
            out.append("| field | type | # | description |")
            out.append("| --- | --- | --- | --- |")
            for f in node["fields"]:
                typ = ("%s %s" % (f["label"], f["type"])).strip()
                out.append("| `%s` | `%s` | %s | %s |" % (f["name"], cell(typ), f["number"],
                                                          cell(f["doc"])))
            out.append("")
        else:
            out.append("(no fields)\n")
    elif node["kind"] == "enum":
        out.append("### %s (enum)\n" % node["name"])
        if node["doc"]:
            out.append(node["doc"] + "\n")
        out.append("| value | # | description |")
        out.append("| --- | --- | --- |")
        for v in node["values"]:
            out.append("| `%s` | %s | %s |" % (v["name"], v["number"], cell(v["doc"])))
        out.append("")
    for n in node["nested"]:
        render_type(n, out)


def render():
    out = ["# Loom API reference", "",
           "Generated by `scripts/api_reference.py` from the comments of `proto/loom/v1/*.proto`; "
           "do not edit by hand (a test fails when it is out of date). Package `loom.v1`. Field "
           "behaviour is written on every field: REQUIRED, OPTIONAL (with its default) or "
           "OUTPUT_ONLY. In YAML specs and JSON, fields use their lowerCamelCase JSON names "
           "(`global_batch_tokens` is `globalBatchTokens`; loomctl accepts both).", ""]
    files = sorted(f for f in os.listdir(PROTO_DIR) if f.endswith(".proto"))
    out.append("Files: " + ", ".join("[%s](#%s)" % (f, f.replace(".", "")) for f in files) + "\n")
    for f in files:
        items = parse(os.path.join(PROTO_DIR, f))
        out.append("## %s\n" % f)
        for s in (i for i in items if i["kind"] == "service"):
            out.append("### service %s\n" % s["name"])
            if s["doc"]:
                out.append(s["doc"] + "\n")
            out.append("| rpc | request | response | description |")
            out.append("| --- | --- | --- | --- |")
            for r in s["rpcs"]:
                out.append("| `%s` | `%s` | `%s` | %s |" % (r["name"], r["request"], r["response"],
                                                          cell(r["doc"])))
            out.append("")
        for i in items:
            if i["kind"] != "service":
                render_type(i, out)
    return "\n".join(out).rstrip("\n") + "\n"


def main():
    text = render()
    if "--check" in sys.argv:
        current = open(OUT).read() if os.path.exists(OUT) else ""
        if current != text:
            print("docs/api-reference.md is out of date: run scripts/api_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(OUT, "w") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
