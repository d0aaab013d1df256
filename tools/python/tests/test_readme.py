# SPDX-License-Identifier: MIT
"""The README's snippets run as written (extracted from README.md, not duplicated)."""

import os
import re

import pytest


def test_readme_python_snippet_runs(root):
    text = open(os.path.join(root, "README.md")).read()
    snippets = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(snippets) == 1, "README.md has one Python snippet"
    scope = {}
    exec(compile(snippets[0], "README.md", "exec"), scope)
    assert scope["matched"] == 32 and scope["done"] == 32  # two sealed 16-token blocks shared
    assert scope["tier"] is not None and len(scope["slots"]) == 40


def test_readme_c_program_compiles_and_runs(root, tmp_path):
    """The README's C program, compiled against this tree's header and library, runs."""
    import shutil
    import subprocess
    lib = os.path.join(root, "build", "libkvtier.so")
    cc = shutil.which("cc")
    if not cc or not os.path.exists(lib):
        pytest.skip("no C compiler or no build/libkvtier.so")
    text = open(os.path.join(root, "README.md")).read()
    snippets = re.findall(r"```c\n(.*?)```", text, re.S)
    assert len(snippets) == 1, "README.md has one C snippet"
    src = tmp_path / "app.c"
    src.write_text(snippets[0])
    exe = tmp_path / "app"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", str(src), "-I",
                    os.path.join(root, "engine"), "-L", os.path.dirname(lib), "-lkvtier",
                    "-Wl,-rpath," + os.path.dirname(lib), "-o", str(exe)], check=True)
    r = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
