"""Every Python snippet of the README and the docs runs, as a user saves and runs it: a script of its
own, from a folder holding the sample data (a snippet that needs a GPU runs on the GPU there)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, child_env

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# libraries a snippet may show that gpubatch does not depend on: its test skips where they are not installed
OPTIONAL = ("nvidia.dali", "torchvision", "torch")


def _marks(code: str) -> list:
    marks = [pytest.mark.gpu] if 'device="gpu"' in code or "nvidia.dali" in code else []  # (GPU ones in gpu-test)
    imported = set(re.findall(r"^(?:import|from) ([\w.]+)", code, re.M))
    missing = [m for m in OPTIONAL if any(i == m or i.startswith(m + ".") for i in imported) and not _has(m)]
    if missing:
        marks.append(pytest.mark.skip(reason=f"{missing[0]} is not installed"))
    return marks


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


SNIPPETS = [pytest.param(doc.relative_to(ROOT), k, code, id=f"{doc.relative_to(ROOT)}#{k}", marks=_marks(code))
            for doc in DOCS for k, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S))]


@pytest.mark.parametrize("doc,k,code", SNIPPETS)
def test_every_python_snippet_of_the_docs_runs(tmp_path, doc, k, code):
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=child_env())
    assert p.returncode == 0, f"{doc} snippet {k}:\n{code}\n{p.stderr[-3000:]}"


def test_the_docs_have_snippets():
    assert len(SNIPPETS) >= 4
