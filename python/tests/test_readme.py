# SPDX-License-Identifier: MIT
"""The README's Python snippet runs as written (extracted from README.md, not duplicated)."""

import os
import re


def test_readme_python_snippet_runs(root):
    text = open(os.path.join(root, "README.md")).read()
    snippets = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(snippets) == 1, "README.md has one Python snippet"
    scope = {}
    exec(compile(snippets[0], "README.md", "exec"), scope)
    assert scope["matched"] == 32 and scope["done"] == 32  # two sealed 16-token blocks shared
    assert scope["tier"] is not None and len(scope["slots"]) == 40
