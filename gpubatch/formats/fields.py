"""Checks of the fields a reader takes from a source, one helper per kind of field.

Every value a dataset hands gpubatch (a label, an image size, a file name, a JSON document, text) goes
through one of these at the reader's edge, so a hostile or broken value becomes one line saying what is
wrong with which field (a ``ValueError`` the reader turns into the record's error) instead of a crash
deeper in, or a table sized by an absurd number.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..types import MAX_LABEL

#: Image sides a header or an annotation may claim (JPEG's limit is 65,535; TIFF and PNG go further).
MAX_SIDE = 2**31 - 1
#: Ids (COCO image, annotation and category ids) must fit the int64 that every writer stores them in.
MAX_ID = 2**63 - 1
#: Nesting a JSON document may have: far beyond any dataset's, far below Python's recursion limit.
MAX_JSON_DEPTH = 200


def number(value: Any, what: str) -> float:
    """A finite JSON/protobuf number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {_shown(value)}, not a number")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{what} {_shown(value)} is out of range") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} is {value}, not a finite number")
    return out


def whole(value: Any, what: str, lo: int, hi: int) -> int:
    """A whole number within [lo, hi] (an integral float such as 480.0 is taken)."""
    if isinstance(value, int) and not isinstance(value, bool):
        out = value
    else:
        x = number(value, what)
        if x != int(x):
            raise ValueError(f"{what} is {value}, not a whole number")
        out = int(x)
    if not lo <= out <= hi:
        raise ValueError(f"{what} {_shown(out)} is outside {lo:,}..{hi:,}")
    return out


def label(value: Any, what: str = "label") -> int | None:
    """A record's class index: None for a negative one (gpubatch writes -1 for "no label"), a
    ValueError for one that is not a whole number or is above :data:`MAX_LABEL`."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0 and math.isfinite(value):
        return None
    return whole(value, what, 0, MAX_LABEL)


def side(value: Any, what: str) -> int:
    """An image height or width as a header or annotation gives it: 0 (unknown) or a positive size."""
    if value is None or value == "":
        return 0
    return whole(value, what, 0, MAX_SIDE)


def ident(value: Any, what: str) -> int:
    """A numeric id (COCO's category and annotation ids) that fits int64."""
    return whole(value, what, -MAX_ID - 1, MAX_ID)


def text(data: bytes, what: str) -> str:
    """UTF-8 text of a bytes field."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (byte {e.start}: {bytes(data)[e.start:e.start + 1]!r})") from None


def name(value: Any, what: str) -> str:
    """A file name from a dataset's metadata: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} is {_shown(value)}, not a file name")
    return value


def json_value(data: bytes | str, what: str, undecodable: str = "strict") -> Any:
    """A JSON document, refused with one line where it is not JSON, holds numbers Python will not
    parse (over 4,300 digits) or is nested beyond :data:`MAX_JSON_DEPTH` (checked on documents up to
    1 MiB, the per-record ones; a dataset-wide file is checked where its parts are taken, see
    :func:`shallow`). ``undecodable="surrogateescape"`` keeps bytes that are not UTF-8 as they are (a
    dataset-wide file whose one damaged name should cost that record only)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = text(bytes(data), what) if undecodable == "strict" else bytes(data).decode("utf-8", undecodable)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError(f"{what} is JSON nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"{what} is not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if len(data) <= 1 << 20:
        shallow(doc, what)
    return doc


def json_text(value: Any, **options: Any) -> str:
    """``value`` as strict JSON text (``options`` as ``json.dumps`` takes them). NaN and the infinities, which a
    source's JSON may hold (Python's parser takes them, and some tools write them) and strict readers refuse
    (pycocotools', a browser's ``JSON.parse``), are written as null."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:  # (a float that is no JSON number, somewhere in it)
        return json.dumps(_finite(value), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite made None, through its dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def shallow(value: Any, what: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``value`` (a parsed JSON value) where it is nested at most ``limit`` levels deep: deeper values
    would break later steps that copy or write them (Python's recursion limit)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if depth > limit:
            raise ValueError(f"{what} is JSON nested more than {limit} levels deep")
        stack.extend((x, depth + 1) for x in items if isinstance(x, (dict, list)))
    return value


def json_object(data: bytes | str, what: str) -> dict:
    """:func:`json_value` that must be a JSON object."""
    doc = json_value(data, what)
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is a JSON {type(doc).__name__}, not an object")
    return doc


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"{value:.3g}" if abs(value) < 10**300 else f"a number of about {int(value.bit_length() * 0.30103)} digits"
    try:
        out = repr(value)
    except ValueError:  # an int beyond Python's 4,300 digits
        return "an enormous number"
    return out if len(out) <= 40 else out[:37] + "..."
