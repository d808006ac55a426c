"""Op chains as text: ``"random_resized_crop(size=224) | flip(p=0.5)"``, pipeline files, presets.

The text is parsed with Python's own expression parser (``ast``), never evaluated: each ``|``-separated
term is an op name, optionally called with literal arguments (numbers, strings, tuples, lists, True,
False, None). Unknown ops and parameters are refused before any data is read, naming the valid ones.
A pipeline file (YAML or JSON) is a list whose items are such terms, or mappings
``{"op": NAME, PARAM: VALUE, ...}``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from ..errors import UsageError, did_you_mean
from .ops import Op, load_all

PRESETS: dict[str, tuple[str, str]] = {
    "resnet50-train": ("random_resized_crop(size=224) | flip(p=0.5)",
                       "ImageNet training crops: random resized crop 224 (scale 0.08-1), horizontal flip"),
    "resnet50-val": ("resize_shorter(size=256) | center_crop(size=224)",
                     "ImageNet evaluation: shorter side 256, central 224 crop"),
    "ssd": ("photometric_distort() | expand(p=0.5) | random_iou_crop() | flip(p=0.5) | resize(height=300, width=300)",
            "SSD300 (box-aware): colour distortion, zoom out, random IoU crop, flip, resize 300x300"),
    "randaugment": ("randaugment(num_ops=2, magnitude=9)", "RandAugment, 2 ops at magnitude 9 of 31"),
    "trivialaugment": ("trivialaugment()", "TrivialAugment wide: one op per image at a random magnitude"),
    "autoaugment-imagenet": ("autoaugment(policy='imagenet')", "AutoAugment with the learned ImageNet policy"),
}


def _fields(cls: type[Op]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def make_op(name: str, args: list[Any] | tuple = (), kwargs: dict[str, Any] | None = None) -> Op:
    """The op ``name`` built from positional and keyword parameters, or a one-line UsageError."""
    ops = load_all()  # (every op module: the whole registry)
    cls = ops.get(name)
    if cls is None:
        raise UsageError(f"unknown op {name!r}{did_you_mean(name, sorted(ops))}; valid ops: {', '.join(sorted(ops))}")
    kwargs = dict(kwargs or {})
    names = [f.name for f in _fields(cls)]
    if len(args) > len(names):
        raise UsageError(f"{name} takes at most {len(names)} positional parameters ({', '.join(names)})")
    for f, v in zip(names, args):
        if f in kwargs:
            raise UsageError(f"{name}: parameter {f!r} given twice")
        kwargs[f] = v
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise UsageError(f"{name}: unknown parameter {unknown[0]!r}{did_you_mean(unknown[0], names)}; valid: "
                         f"{', '.join(names) or 'none'}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        missing = [f.name for f in _fields(cls) if f.name not in kwargs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise UsageError(f"{name}: missing parameter {', '.join(missing)}" if missing else f"{name}: {e}") from None
    except (ValueError, OverflowError) as e:
        raise UsageError(f"{name}: {e}") from None


def _terms(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _literal(node: ast.AST, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise UsageError(f"{where}: parameters must be literals (numbers, strings, tuples), got {ast.unparse(node)!r}") from None


def _term(node: ast.AST) -> Op:
    if isinstance(node, ast.Name):
        return make_op(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        args = [_literal(a, name) for a in node.args]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise UsageError(f"{name}: **kwargs are not supported")
            kwargs[kw.arg] = _literal(kw.value, name)
        return make_op(name, args, kwargs)
    raise UsageError(f"cannot read op {ast.unparse(node)!r}: write name(param=value, ...)")


def _plain(doc: str) -> str:
    """A docstring's reStructuredText as plain text: ``code`` and :role:`name` lose their marks."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return re.sub(r"``([^`]+)``", r"\1", doc)


def parse_chain(text: str) -> tuple[Op, ...]:
    """``"op(k=v) | op2 | ..."`` -> ops."""
    text = (text or "").strip()
    if not text:
        raise UsageError("empty op chain")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        col = e.offset if e.offset and e.offset <= len(text) else len(text)  # (0 at the very end)
        raise UsageError(f"cannot parse op chain at column {col}: {text!r}") from None
    return tuple(_term(t) for t in _terms(tree.body))


def load_pipeline(path: str | Path) -> tuple[Op, ...]:
    """Ops from a YAML or JSON pipeline file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"cannot read pipeline file {p}: {e.strerror}") from None
    try:
        if p.suffix.lower() == ".json":
            doc = json.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError
        raise UsageError(f"pipeline file {p} is not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: "
                         f"{str(e).splitlines()[0]}") from None
    if isinstance(doc, dict) and "ops" in doc:
        doc = doc["ops"]
    if not isinstance(doc, list) or not doc:
        raise UsageError(f"pipeline file {p} must hold a non-empty list of ops")
    ops: list[Op] = []
    for item in doc:
        if isinstance(item, str):
            ops.extend(parse_chain(item))
        elif isinstance(item, dict) and "op" in item:
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in item.items() if k != "op"}
            ops.append(make_op(str(item["op"]), kwargs=params))
        elif isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), (dict, type(None))):
            (name, params), = item.items()
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in (params or {}).items()}
            ops.append(make_op(str(name), kwargs=params))
        else:
            raise UsageError(f"pipeline file {p}: cannot read item {item!r}; write {{op: NAME, param: value}}")
    return tuple(ops)


def preset(name: str) -> tuple[Op, ...]:
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}{did_you_mean(name, list(PRESETS))}; valid presets: "
                         f"{', '.join(PRESETS)}")
    return parse_chain(PRESETS[name][0])


def op_spec(op: Op) -> str:
    """The op as chain text, parameters that differ from their defaults only (parses back to ``op``)."""
    default = None
    try:
        default = type(op)()
    except TypeError:
        pass
    parts = []
    for f in _fields(type(op)):
        v = getattr(op, f.name)
        if default is not None and getattr(default, f.name) == v:
            continue
        parts.append(f"{f.name}={v!r}")
    return f"{op.name}({', '.join(parts)})"


def chain_spec(ops: tuple[Op, ...]) -> str:
    return " | ".join(op_spec(op) for op in ops)


def describe_ops() -> list[dict[str, Any]]:
    """Every op: name, parameters with defaults, whether it moves boxes, what it does."""
    out = []
    ops = load_all()
    for name in sorted(ops):
        cls = ops[name]
        params = []
        for f in _fields(cls):
            if f.default is not dataclasses.MISSING:
                params.append((f.name, repr(f.default)))
            else:
                params.append((f.name, None))
        doc = _plain(" ".join((cls.__doc__ or "").split()))
        out.append({"name": name, "params": params, "moves_boxes": bool(cls.moves_boxes),
                    "random": bool(cls.random), "doc": doc})
    return out
