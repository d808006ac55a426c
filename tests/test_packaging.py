"""The project's dependency ranges: every one bounded above at a next major version, and what is installed
within them."""

from __future__ import annotations

import importlib.metadata

import tomllib
from packaging.requirements import Requirement

from tests.helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIREMENTS = [Requirement(r) for r in PROJECT["dependencies"]] + [
    Requirement(r) for extra in PROJECT["optional-dependencies"].values() for r in extra]


def test_every_dependency_has_a_lower_and_an_upper_bound():
    for req in REQUIREMENTS:
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and "<" in ops, f"{req}: give it a tested range (>=low,<next major)"
        upper = next(s.version for s in req.specifier if s.operator == "<")
        assert upper.endswith(tuple(f"{n}" for n in range(10))) and upper.count(".") == 0, \
            f"{req}: bound it at a next major version ({upper})"


def test_what_is_installed_lies_within_the_ranges():
    unknown = []
    for req in (Requirement(r) for r in PROJECT["dependencies"]):
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            unknown.append(req.name)
            continue
        assert req.specifier.contains(version, prereleases=True), f"{req.name} {version} is outside {req.specifier}"
    assert not unknown, (f"no installed metadata for {', '.join(unknown)}: not installed by pip (copied onto the path?), "
                         "so its version cannot be checked")
