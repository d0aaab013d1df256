# SPDX-License-Identifier: MIT
"""The ctypes mirrors of the binding match kvtier.h: every struct has the header's fields, in
order, with the size and field offsets a C compiler gives them (compiled here with cc; skipped
when there is none); every enum value the binding names equals the header's; every KVT_API
function of the header has a prototype."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import kvtier
from kvtier import _ffi


def header(root):
    return open(os.path.join(root, "engine", "kvtier.h")).read()


def header_fields(text, cname):
    """Field names of struct @cname in declaration order (comments stripped)."""
    body = re.search(r"struct " + cname + r" \{(.*?)\n\};", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        fp = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)  # function pointer
        names.append(fp.group(1) if fp else re.search(r"(\w+)\s*(\[[^\]]*\])?$",
                                                        decl).group(1))
    return names


def compile_and_run(root, tmp_path, body):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "probe.c"
    src.write_text("\n".join(['#include <stdio.h>', '#include <stddef.h>',
                              '#include "kvtier.h"', 'int main(void) {'] + body
                             + ["return 0; }"]))
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(root, "engine"), "-o", str(exe),
                    str(src)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        s, f, v = line.split()
        out[(s, f)] = int(v)
    return out


def test_struct_fields_match_header(root):
    text = header(root)
    declared = set(re.findall(r"^struct (kvt_\w+) \{", text, re.M))
    assert declared == set(_ffi.STRUCTS), "structs of kvtier.h not mirrored (or stale)"
    for cname, py in _ffi.STRUCTS.items():
        assert [f for f, _ in py._fields_] == header_fields(text, cname), cname


def test_struct_layouts_match_c(root, tmp_path):
    body = []
    for cname, py in _ffi.STRUCTS.items():
        body.append(f'printf("{cname} @size %zu\\n", sizeof(struct {cname}));')
        for fname, _ in py._fields_:
            body.append(f'printf("{cname} {fname} %zu\\n", offsetof(struct {cname}, '
                        f'{fname}));')
    c = compile_and_run(root, tmp_path, body)
    for cname, py in _ffi.STRUCTS.items():
        assert c[(cname, "@size")] == ctypes.sizeof(py), cname
        for fname, _ in py._fields_:
            assert c[(cname, fname)] == getattr(py, fname).offset, f"{cname}.{fname}"


def test_enums_match_c(root, tmp_path):
    named = {"KVT_CODEC_" + k.upper(): v for k, v in kvtier.CODECS.items()}
    named.update({"KVT_EVICT_" + k.upper(): v for k, v in kvtier.EVICT_POLICIES.items()})
    named.update({"KVT_TIER_" + n.upper(): i for i, n in enumerate(kvtier.TIER_NAMES)})
    named.update({"KVT_MOVE_" + n.upper(): i for i, n in enumerate(kvtier.MOVE_NAMES)})
    named.update({"KVT_E" + n: getattr(kvtier, "E" + n) for n in
                  ("DEVICE", "SHORTIO", "CORRUPT", "CLOSED", "LOST", "FORMAT", "TOOBIG",
                   "BUSY", "NOTSUP")})
    named["KVT_TIER_COUNT"] = _ffi.TIER_COUNT
    named["KVT_MOVE_COUNT"] = _ffi.MOVE_COUNT
    named["KVT_LAT_BUCKETS"] = _ffi.LAT_BUCKETS
    # every enumerator of these enums is named by the binding
    text = header(root)
    for enum in ("kvt_codec", "kvt_evict_policy"):
        body = re.search(r"enum " + enum + r" \{(.*?)\};", text, re.S).group(1)
        for name in re.findall(r"\b(KVT_\w+)\s*=", body):
            assert name in named, name
    c = compile_and_run(root, tmp_path,
                        [f'printf("e {n} %lld\\n", (long long){n});' for n in named])
    for n, v in named.items():
        assert c[("e", n)] == v, n


def test_every_function_has_a_prototype(root):
    text = header(root)
    funcs = set(re.findall(r"^KVT_API [^(]*?\b(kvt_\w+)\(", text, re.M))
    assert len(funcs) >= 39
    assert funcs == set(_ffi._PROTOS)
