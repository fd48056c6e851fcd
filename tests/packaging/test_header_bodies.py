#!/usr/bin/env python3
"""Every header whose bodies live in a detail/*.inl behind DCR_HEADER_BODIES_OF gets them.

A .inl guarded by `#if DCR_HEADER_BODIES_OF(part)` needs dcr/config.hpp included before it:
without it the guard does not compile, or (with a plain `#if DCR_HEADER_BODIES`, an undefined
macro being 0 in #if) compiles nothing, and in header-only mode the header would then declare
functions nobody defines, so that a program that includes only that header fails to link.
For each such .inl, this preprocesses its header alone, in header-only mode, and checks that
dcr/config.hpp was entered before the .inl, and that the header includes its .inl at all.

usage: test_header_bodies.py COMPILER... -- INCLUDE_DIR
"""
import pathlib
import re
import subprocess
import sys

args = sys.argv[1:]
sep = args.index('--')
compiler, include_dir = args[:sep], pathlib.Path(args[sep + 1])
failures = []
inls = sorted(p for p in (include_dir / 'dcr' / 'detail').rglob('*.inl')
              if 'DCR_HEADER_BODIES' in p.read_text())
if not inls:
    sys.exit('no guarded .inl files found under ' + str(include_dir))
for inl in inls:
    rel = inl.relative_to(include_dir / 'dcr' / 'detail')
    header = pathlib.Path('dcr') / rel.with_suffix('.hpp')
    if not (include_dir / header).exists():
        failures.append(f'{inl}: no header {header} for it')
        continue
    out = subprocess.run(compiler + ['-std=c++20', '-I', str(include_dir), '-E', '-x', 'c++', '-'],
                         input=f'#include "{header}"\n', capture_output=True, text=True)
    if out.returncode != 0:
        failures.append(f'{header}: does not preprocess alone: {out.stderr.strip()[:300]}')
        continue
    entered = [m.group(1) for m in re.finditer(r'^# \d+ "([^"]+)"', out.stdout, re.M)]
    names = [pathlib.Path(e).as_posix() for e in entered]
    inl_at = next((i for i, n in enumerate(names) if n.endswith('dcr/detail/' + rel.as_posix())), None)
    config_at = next((i for i, n in enumerate(names) if n.endswith('dcr/config.hpp')), None)
    if inl_at is None:
        failures.append(f'{header}: does not include dcr/detail/{rel.as_posix()}')
    elif config_at is None or config_at > inl_at:
        failures.append(f'{header}: includes dcr/detail/{rel.as_posix()} before dcr/config.hpp, '
                        'so DCR_HEADER_BODIES is undefined there and its bodies are dropped')
for f in failures:
    print('FAIL', f)
print(f'{len(inls)} guarded .inl files, {len(failures)} failure(s)')
sys.exit(1 if failures else 0)
