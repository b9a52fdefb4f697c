#!/usr/bin/env python3
"""Writes crates/skiff-core/src/protobuf_fields.txt: the field numbers of
every Kubernetes API protobuf message, read from the file descriptors a
kubectl binary carries (client-go registers each generated.proto as a
gzipped FileDescriptorProto), so the server decodes every message kubectl
can send with the numbering kubectl uses.

Usage: scripts/protobuf-fields.py [path/to/kubectl]  (default .tools/bin/kubectl)

One line per message: its full name, then `number name` per field, with
`:Type` after fields whose type is another message (not a map entry).
"""
import os
import re
import sys
import zlib


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    i, out = 0, []
    while i < len(b):
        k, i = varint(b, i)
        n, wt = k >> 3, k & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            ln, i = varint(b, i)
            v, i = b[i:i + ln], i + ln
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type")
        out.append((n, v))
    return out


def descriptors(binary):
    data = open(binary, "rb").read()
    found = {}
    for m in re.finditer(b"\x1f\x8b\x08\x00\x00\x00\x00\x00", data):
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[m.start():m.start() + 4_000_000])
            name = next(v for n, v in fields(d) if n == 1).decode()
        except Exception:
            continue
        if name.startswith("k8s.io/") and name.endswith("/generated.proto"):
            found[name] = d
    return found


def messages(prefix, b, out, entries):
    fs = fields(b)
    name = prefix + next(v for n, v in fs if n == 1).decode()
    opts = [v for n, v in fs if n == 7]
    if opts and any(n == 7 and v == 1 for n, v in fields(opts[0])):
        entries.add(name)  # a map entry
    for n, v in fs:
        if n == 3:
            messages(name + ".", v, out, entries)
    out[name] = [
        {k: v for k, v in fields(f)} for n, f in fs if n == 2
    ]


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, ".tools/bin/kubectl")
    out, entries = {}, set()
    for name, d in sorted(descriptors(binary).items()):
        fs = fields(d)
        pkg = next((v.decode() for n, v in fs if n == 2), "")
        for n, v in fs:
            if n == 4:
                messages(pkg + ".", v, out, entries)
    lines = []
    for name in sorted(out):
        if name in entries:
            continue
        parts = []
        for f in sorted(out[name], key=lambda f: f[3]):
            p = f"{f[3]} {f[1].decode()}"
            t = f.get(6, b"").decode().lstrip(".")
            if f.get(5) == 11 and t and t not in entries:
                p += ":" + t
            parts.append(p)
        lines.append(name + " " + ",".join(parts))
    dest = os.path.join(root, "crates/skiff-core/src/protobuf_fields.txt")
    with open(dest, "w") as w:
        w.write("\n".join(lines) + "\n")
    print(f"{len(lines)} messages written to {dest}")


if __name__ == "__main__":
    main()
