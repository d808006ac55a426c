"""The house's layers, checked: each layer imports only those below it (lazy imports inside functions
included), so the engine stays usable without the formats, and the command line stays a thin adapter.

    cli, bench               the command line, the bench
    api, runner, report      the run and what it says
    pipelines, formats       training pipelines; dataset formats
    engine                   plans, ops, codecs, the GPU engine, the execution layer
    _publish                 a run's files sent to a store
    types, _paths, _commit, synthetic
    _remote                  URLs and remote sources' mirrors (the reads of _paths go through it)
    errors
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "gpubatch"
# what each layer may not import (a layer never imports one above it)
FORBIDDEN = {
    "gpubatch.engine": ("gpubatch.formats", "gpubatch.pipelines", "gpubatch.report", "gpubatch.cli", "gpubatch.bench",
                        "gpubatch.api", "gpubatch.runner", "gpubatch.training"),
    "gpubatch.formats": ("gpubatch.pipelines", "gpubatch.report", "gpubatch.cli", "gpubatch.bench", "gpubatch.api",
                         "gpubatch.runner", "gpubatch.training"),
    "gpubatch.pipelines": ("gpubatch.formats", "gpubatch.report", "gpubatch.cli", "gpubatch.bench", "gpubatch.api",
                           "gpubatch.runner", "gpubatch.training"),
    "gpubatch.report": ("gpubatch.cli", "gpubatch.bench"),
    "gpubatch.types": ("gpubatch.engine", "gpubatch.formats", "gpubatch.pipelines", "gpubatch.report", "gpubatch.cli",
                       "gpubatch.bench", "gpubatch.api", "gpubatch.runner", "gpubatch.training"),
    "gpubatch._remote": ("gpubatch._paths", "gpubatch._publish", "gpubatch._commit", "gpubatch.engine", "gpubatch.formats", "gpubatch.pipelines", "gpubatch.report", "gpubatch.cli",
                         "gpubatch.bench", "gpubatch.api", "gpubatch.runner", "gpubatch.training"),
    "gpubatch._publish": ("gpubatch.engine", "gpubatch.formats", "gpubatch.pipelines", "gpubatch.report", "gpubatch.cli",
                          "gpubatch.bench", "gpubatch.api", "gpubatch.runner", "gpubatch.training"),
    "gpubatch.errors": ("gpubatch.engine", "gpubatch.formats", "gpubatch.pipelines", "gpubatch.report", "gpubatch.cli",
                        "gpubatch.bench", "gpubatch.api", "gpubatch.runner", "gpubatch.training"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code, as absolute names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def test_every_layer_imports_only_the_layers_below_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for layer, banned in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                wrong += [f"{name} imports {m}" for m in sorted(imports(path))
                          if any(m == b or m.startswith(b + ".") for b in banned)]
    assert not wrong, "\n".join(wrong)


def test_every_registry_refuses_a_second_definition_under_a_name_taken():
    import dataclasses

    import pytest

    from gpubatch.engine import media, registry
    from gpubatch.engine.ops import OPS, Op
    from gpubatch.formats import FORMATS, format_names, register_format

    format_names()  # (the built-in formats registered)
    with pytest.raises(ValueError, match="format 'webdataset' is registered already"):
        register_format(type("MyWebDataset", (FORMATS["webdataset"],), {"name": "webdataset"}))
    with pytest.raises(ValueError, match="op 'flip' is registered already"):
        dataclasses.dataclass(frozen=True)(type("MyFlip", (Op,), {"name": "flip", "__annotations__": {}}))
    assert OPS["flip"].__module__ == "gpubatch.engine.ops.geometry"
    with pytest.raises(ValueError, match="the host kernel of op 'flip'"):
        registry.register_kernel("flip", registry.HOST)(lambda op, images, params: images)
    media._load()
    with pytest.raises(ValueError, match="the host codec of image"):
        media.register_codec("image", "*", media.HOST, object())
    assert FORMATS["webdataset"].__name__ != "MyWebDataset"


def test_op_modules_are_imported_when_first_needed_and_built_ins_register_first():
    """A worker's run module and the ops package import no op module (a pass-through needs none); a name of
    the package imports its own module; ``load_all`` gives the whole registry. An op or a kernel defined
    outside the built-ins under a built-in's name, before that built-in's module was imported, is refused
    all the same (the built-ins load first), and the built-in stays. In a fresh interpreter each: this one
    has imported every op module already."""
    import subprocess
    import sys

    lazy = """
import sys
import gpubatch.engine.execute.worker, gpubatch.engine.ops as ops
mods = lambda: sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("gpubatch.engine.ops."))
print(mods())
from gpubatch.engine.ops import ResizeShorter
print(mods())
reg = ops.load_all()
named = [getattr(ops, n) for n in ops.__all__]
named = [c for c in named if isinstance(c, type) and issubclass(c, ops.Op) and c.__dict__.get("name")]
print(mods() == sorted({"base", *ops.MODULES}), len(named) > 40 and all(reg[c.name] is c for c in named))
"""
    first = """
import dataclasses, sys
from gpubatch.engine import registry
from gpubatch.engine.ops import Op
try:
    registry.register_kernel("flip", registry.HOST)(lambda op, images, params: images)
except ValueError as e:
    print("kernel refused:", "registered already" in str(e))
""" + """
try:
    dataclasses.dataclass(frozen=True)(type("MyGain", (Op,), {"name": "gain", "__annotations__": {}}))
except ValueError as e:
    print("op refused:", "registered already" in str(e))
from gpubatch.engine.ops import OPS
print(OPS["gain"].__module__, OPS["flip"].__module__)
"""
    from gpubatch.engine import ops

    files = {p.stem for p in (ROOT / "gpubatch/engine/ops").glob("*.py")} - {"__init__", "base"}
    assert files == set(ops.MODULES)  # (an op module with no name in _WHERE would be missing from --ops)
    for code, want in ((lazy, ["['base']", "['base', 'geometry']", "True True"]),
                       (first, ["kernel refused: True", "op refused: True",
                                "gpubatch.engine.ops.audio gpubatch.engine.ops.geometry"])):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert p.stdout.splitlines() == want, p.stdout + p.stderr
