"""Caffe's ``Datum`` (proto2) encoded and parsed by hand (no maintained package ships it), the keys an LMDB of
them takes, and what an LMDB file must hold: what the LMDB format's reader (:mod:`.lmdb`) and its writing
(:mod:`.lmdb_sink`) share."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

from .._paths import lfs_pointer
from ..errors import DependencyError, FormatError

MAX_KEY_BYTES = 511
_LMDB_MAGIC = 0xBEEFC0DE


def _lmdb():
    """The lmdb package (a one-line error where it cannot load)."""
    try:
        import lmdb
    except ImportError:  # pragma: no cover - a core dependency
        raise DependencyError("the lmdb format needs the lmdb package: pip install lmdb") from None
    return lmdb


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 values are sign-extended to 10 bytes, as protobuf does
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def datum_parts(size: int, label: int, encoded: bool = True) -> tuple[bytes, bytes]:
    """The bytes of a Datum before and after ``size`` bytes of data: field data (4) opened, then label (5)
    and encoded (7)."""
    return b"\x22" + _varint(size), b"\x28" + _varint(label) + b"\x38" + (b"\x01" if encoded else b"\x00")


def encode_datum(data: bytes, label: int, encoded: bool = True) -> bytes:
    """Serialize a Caffe Datum with fields data (4), label (5) and encoded (7)."""
    head, tail = datum_parts(len(data), label, encoded)
    return head + data + tail


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def decode_datum(buf: bytes) -> dict:
    """Parse a Datum into {channels, height, width, data, label, encoded} (absent fields left out)."""
    out: dict = {}
    i, n = 0, len(buf)
    names = {1: "channels", 2: "height", 3: "width", 5: "label", 7: "encoded"}
    while i < n:
        tag, i = _read_varint(buf, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
            if field in names:
                if v >= 1 << 63:
                    v -= 1 << 64
                out[names[field]] = bool(v) if field == 7 else v
        elif wire == 2:
            ln, i = _read_varint(buf, i)
            if i + ln > n:
                raise ValueError("truncated Datum")
            if field == 4:
                out["data"] = bytes(buf[i : i + ln])
            i += ln
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise ValueError(f"bad wire type {wire}")
    if i != n:
        raise ValueError("truncated Datum")
    return out


def datum_layout(read: Any, size: int) -> tuple[int, int, dict] | None:
    """Where a Datum's ``data`` lies in its value of ``size`` bytes (start, length) and its other fields, from the
    value's first 64 bytes and the bytes after the data only (``read(offset, n)`` reads the value): ``info`` reads
    a record's header and label so, not its image. None where the value is not a Datum laid out so (the fields
    before ``data`` small, as Caffe and gpubatch write them): the whole value says what it is."""
    head = read(0, min(size, 64))
    i = 0
    try:
        while i < len(head):
            at = i
            tag, i = _read_varint(head, i)
            if tag == (4 << 3 | 2):  # (the data: its length, then its bytes)
                ln, i = _read_varint(head, i)
                if i + ln > size:
                    return None
                fields = decode_datum(head[:at])
                rest = decode_datum(read(i + ln, size - i - ln))
                if "data" in fields or "data" in rest:
                    return None
                return i, ln, {**fields, **rest}
            if tag & 7 != 0:
                return None
            _, i = _read_varint(head, i)
    except ValueError:
        return None
    return None


def datum_key(index: int, key: str) -> bytes:
    """``%08d_<key>`` in UTF-8 (a name's bytes that are not UTF-8 kept as they are), the key part hashed when the
    whole would pass LMDB's 511-byte limit."""
    k = f"{index:08d}_{key}".encode("utf-8", "surrogateescape")
    if len(k) > MAX_KEY_BYTES:
        k = f"{index:08d}_{hashlib.sha1(key.encode('utf-8', 'surrogateescape')).hexdigest()}".encode()
    return k


def _data_file(path: Path) -> Path:
    return path if path.is_file() else path / "data.mdb"


def needed_bytes(data_mdb: Path) -> int:
    """The bytes an LMDB file must hold for its last page, from its newer meta page (page 0 or 1): one
    that holds fewer would crash its reader (a bus error on the memory map), so it is refused first.

    Raises:
        FormatError: the file is no LMDB file, or is shorter than its meta page says.
    """
    try:
        with open(data_mdb, "rb") as f:
            head = f.read(2 * 65536)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise FormatError(f"cannot read {data_mdb}: {e.strerror or e}") from None
    lfs = lfs_pointer(head)
    if lfs is not None:
        raise FormatError(f"{data_mdb} is {lfs}")
    metas = []
    psize = struct.unpack_from("<I", head, 40)[0] if len(head) >= 44 else 0
    for at in (0, psize):  # meta pages: page header (16 bytes) then magic, version, ..., last page, txnid
        if 0 <= at and at + 152 <= len(head) and struct.unpack_from("<I", head, at + 16)[0] == _LMDB_MAGIC:
            last_pg, txnid = struct.unpack_from("<QQ", head, at + 136)
            metas.append((txnid, last_pg))
    if not metas or psize < 512 or psize & (psize - 1):
        raise FormatError(f"{data_mdb} is not an LMDB data file (no meta page)")
    _, last_pg = max(metas)
    need = (last_pg + 1) * psize
    if size < need:
        why = "is cut short" if size % psize or need <= 2 * size else "is cut short or its meta page damaged"
        raise FormatError(f"{data_mdb} {why}: it holds {size:,} bytes, its last page ends at byte {need:,}; "
                          "it cannot be read safely (restore the file)")
    return need
