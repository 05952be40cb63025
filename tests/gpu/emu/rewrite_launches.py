#!/usr/bin/env python3
"""Copies kernels/cuda/*.cu to OUT_DIR/*.cc with every kernel launch
`kernel<...><<<grid, block, smem, stream>>>(args)` rewritten to
`::loom::emu::Launch(&kernel<...>, grid, block, smem, stream)(args)`, for the CPU emulation
(tests/gpu/emu/README.md). Usage: rewrite_launches.py REPO_ROOT OUT_DIR [NAME=VALUE ...];
each NAME=VALUE replaces `constexpr int NAME = <number>;` (to shrink chunk sizes)."""
import pathlib
import re
import sys

LAUNCH = re.compile(r'([A-Za-z_]\w*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)


def main():
    root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    overrides = dict(arg.split('=', 1) for arg in sys.argv[3:])
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted((root / 'kernels' / 'cuda').glob('*.cu')):
        text = LAUNCH.sub(lambda m: '::loom::emu::Launch(&%s, %s)(' % (m.group(1), m.group(2)),
                          source.read_text())
        for name, value in overrides.items():
            text = re.sub(r'constexpr int %s = \d+;' % re.escape(name),
                          'constexpr int %s = %s;' % (name, value), text)
        target = out / (source.stem + '.cc')
        # Rewrite only what changed, so an incremental build recompiles only that.
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


if __name__ == '__main__':
    main()
