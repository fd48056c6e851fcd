#!/usr/bin/env python3
"""Every public header compiles alone, header-only.

The project's own programs build over the compiled core (DCR_SEPARATE_COMPILATION, see
meson.build), so nothing else would notice a public header that no longer compiles on its own
in the default, header-only mode: a missing include, a body that needs another header first, a
declaration whose definition only separate compilation provides. For each header under
include/dcr/ (detail/ excepted: those are parts of the others) this compiles a unit that
includes it and nothing else, with -fsyntax-only, in header-only mode, several at once.

Headers whose third-party headers are not installed here are reported as skipped by name
(dcr/exec/thrust.hpp without CUDA's Thrust, dcr/dlpack.hpp without dlpack/dlpack.h); any other
failure fails the test with the compiler's first lines.

usage: test_headers_alone.py COMPILER... -- INCLUDE_DIR [-I DIR]...
"""
import concurrent.futures
import os
import pathlib
import subprocess
import sys

args = sys.argv[1:]
sep = args.index('--')
compiler, rest = args[:sep], args[sep + 1:]
include_dir = pathlib.Path(rest[0])
extra = rest[1:]
headers = sorted(p.relative_to(include_dir).as_posix()
                 for p in (include_dir / 'dcr').rglob('*.hpp')
                 if 'detail' not in p.relative_to(include_dir / 'dcr').parts)
if not headers:
    sys.exit('no public headers found under ' + str(include_dir))
# A header whose own third-party dependency is absent here: (header, the missing include).
optional = {'dcr/exec/thrust.hpp': 'thrust/', 'dcr/dlpack.hpp': 'dlpack/dlpack.h',
            'dcr/separate_compilation.hpp': None}


def compile_alone(header):
    if header == 'dcr/separate_compilation.hpp':
        # Only for separate mode, by its contract (it stops with #error otherwise).
        source = '#define DCR_SEPARATE_COMPILATION 1\n#include "dcr/separate_compilation.hpp"\n'
    else:
        source = f'#include "{header}"\n#include "{header}"\n'  # and its include guard holds
    cmd = compiler + ['-std=c++20', '-fsyntax-only', '-Wall', '-Wextra', '-Werror=return-type',
                      '-I', str(include_dir), *extra, '-x', 'c++', '-']
    out = subprocess.run(cmd, input=source, capture_output=True, text=True)
    return header, out.returncode, out.stderr


failures, skipped = [], []
with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for header, rc, err in pool.map(compile_alone, headers):
        if rc == 0:
            continue
        missing = optional.get(header)
        if missing and f'{missing}' in err and 'No such file' in err:
            skipped.append(f'{header} (needs {missing}, not installed)')
            continue
        failures.append(f'{header}:\n' + '\n'.join(err.strip().splitlines()[:12]))
for s in skipped:
    print('SKIP', s)
for f in failures:
    print('FAIL', f)
print(f'{len(headers)} public headers compiled alone header-only, {len(skipped)} skipped, '
      f'{len(failures)} failure(s)')
sys.exit(1 if failures else 0)
