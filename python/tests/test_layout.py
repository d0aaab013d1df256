# SPDX-License-Identifier: MIT
"""Every ctypes struct of the binding has the size and field offsets a C compiler gives the
struct of kvtier.h (compiled here with cc; skipped when there is none)."""
import ctypes
import os
import shutil
import subprocess

import pytest

from kvtier import _ffi


def test_struct_layouts_match_c(root, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "kvtier.h"',
             'int main(void) {']
    for cname, py in _ffi.STRUCTS.items():
        lines.append(f'printf("{cname} @size %zu\\n", sizeof(struct {cname}));')
        for fname, _ in py._fields_:
            lines.append(f'printf("{cname} {fname} %zu\\n", offsetof(struct {cname}, '
                         f'{fname}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(root, "engine"), "-o", str(exe),
                    str(src)], check=True)
    c = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        s, f, v = line.split()
        c[(s, f)] = int(v)
    for cname, py in _ffi.STRUCTS.items():
        assert c[(cname, "@size")] == ctypes.sizeof(py), cname
        for fname, _ in py._fields_:
            assert c[(cname, fname)] == getattr(py, fname).offset, f"{cname}.{fname}"
