"""A tar shard read member by member without trusting it: its headers walked block by block (GNU long
names and PAX records too), members that claim more bytes than the file holds and a shard cut inside a
member found, and the members grouped into samples by key as webdataset groups them (DALI's ``.idx``
compared where one lies beside the shard); a member's header checked where an index places it, and built for
a member written. The WebDataset format's reader and writer (:mod:`.webdataset`) are built on it.
"""

from __future__ import annotations

import functools
import os
import re
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

from .._paths import older, read_range, read_regular
from .base import Damaged

#: why a member with a leading '.' or '__' is no sample's (a macOS tar's ``._photo.jpg`` beside each photo)
HIDDEN_NAME = "a hidden name (a leading '.' or '__')"
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's base_plus_ext, key without dots


def split_member(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name as webdataset and DALI group it, or None to skip it."""
    base = name.rsplit("/", 1)[-1]
    if not base or base.startswith(".") or base.startswith("__"):
        return None
    m = _KEY_EXT.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def split_file(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member read as a file of the folder the tar's extraction makes: the name without its last
    extension, as a folder's file is keyed (``cat/cat.0.jpg``: ``cat/cat.0``, where webdataset's rule groups every
    ``cat/cat.*`` into one sample), or None to skip it (a hidden name, or none to key)."""
    from .files import _strip_ext

    base = name.rsplit("/", 1)[-1]
    if not base or base.startswith(".") or base.startswith("__") or "." not in base:
        return None
    key = _strip_ext(name)
    return key, name[len(key) + 1 :].lower()


_BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(_BLOCK)


def _pax_fields(data: bytes) -> dict[str, str]:
    """The records of a pax extended header (``"%d %s=%s\\n"`` each) that name a member: path and size."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        sp = data.find(b" ", pos)
        if sp < 0:
            break
        try:
            n = int(data[pos:sp])
        except ValueError:
            break
        if n <= 0:
            break
        key, _, value = data[sp + 1 : pos + n].rstrip(b"\n").partition(b"=")
        if key in (b"path", b"size"):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += n
    return out


def scan_tar(f: Any, size: int) -> tuple[list[tuple[str, int, int, int]], list[tuple[int, int, str]], bool]:
    """The regular-file members of a tar (name, data offset, size, header offset), its damaged
    stretches (start, end, what) and whether it ends with its end-of-archive (zero) block, walking the
    headers one 512-byte block at a time. A tar that stops right after a member, without that block,
    was cut short (a partial copy), possibly on a member boundary where nothing else shows it.

    A block that is no valid header (its checksum fails, a number is no number, a member would run past
    the file's end) starts a damaged stretch, which ends at the next valid header: the members after
    the damage are kept, as the contract for broken containers asks. GNU long names and pax ``path`` and
    ``size`` records are followed; zero blocks (the end of the archive) are no damage.
    """
    members: list[tuple[str, int, int, int]] = []
    damage: list[tuple[int, int, str]] = []
    bad: list[Any] = []  # [start, end of its last non-zero block, what] of the open damaged stretch
    long_name: str | None = None
    pax: dict[str, str] = {}
    pos = 0
    ended = False  # a zero block after the last header: the end of the archive
    while pos + _BLOCK <= size:
        f.seek(pos)
        block = f.read(_BLOCK)
        if block == _ZERO_BLOCK:
            ended = True
            pos += _BLOCK
            continue
        ended = False
        why = None
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            length = int(pax["size"]) if "size" in pax else info.size
            if length < 0 or pos + _BLOCK + length > size:
                why = f"a member header ({info.name[:60]!r}) that claims {length:,} bytes, past the end"
        except (tarfile.HeaderError, ValueError, UnicodeError):
            why = "no valid tar header"
        if why is not None:
            if not bad:
                bad = [pos, pos + _BLOCK, why]
            else:
                bad[1] = pos + _BLOCK
            pos += _BLOCK
            continue
        if bad:
            damage.append(tuple(bad))
            bad = []
        data = pos + _BLOCK
        nxt = data + length + (-length % _BLOCK)
        if info.type == tarfile.GNUTYPE_LONGNAME:
            f.seek(data)
            long_name = f.read(length).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            f.seek(data)
            pax = _pax_fields(f.read(min(length, 1 << 20)))
        elif info.type == tarfile.XGLTYPE or info.type == tarfile.GNUTYPE_LONGLINK:
            pass
        else:
            if info.type in tarfile.REGULAR_TYPES:
                members.append((pax.get("path") or long_name or info.name, data, length, pos))
            long_name, pax = None, {}
        pos = nxt
    if bad:
        damage.append(tuple(bad))
    if pos < size:
        f.seek(pos)
        if f.read(size - pos).strip(b"\0"):
            damage.append((pos, size, "a truncated last block"))
    return members, damage, ended or not members and not damage


def _samples(s: int, tar: Path, members: list[tuple[str, int, int, int]],
             damage: list[tuple[int, int, str]], split: Any = split_member) -> list[tuple[int, str, tuple] | Damaged]:
    """Members grouped into samples as webdataset and DALI group them (consecutive members sharing a
    key; ``split`` names a member's key and extension: :func:`split_file` for a tar read as the folder its extraction
    makes, a file a record), in shard order, with each damaged stretch as a Damaged entry.

    Next to a damaged stretch, a sample that lacks a member the shard's samples hold (its ``.cls`` or
    its image lay in the stretch) is a Damaged entry in the stretch's place: written, it would be a
    record without its label, or no record at all. Where neither neighbour lacks one, what the
    stretch held is unknown and it stays a Damaged entry of its own."""
    events: list[tuple[int, Any]] = [(m[3], m) for m in members] + [(d[0], d) for d in damage]
    events.sort(key=lambda e: e[0])
    seq: list[Any] = []  # (s, key, members) samples and (start, end, what) stretches, in shard order
    current = None
    for _, ev in events:
        if len(ev) == 3:
            seq.append(ev)
            current = None
            continue
        name, off, size, head = ev
        ke = split(name)
        if ke is None:  # a member webdataset and DALI leave out: listed, not dropped in silence
            base = name.rsplit("/", 1)[-1]
            why = "no extension" if "." not in base.lstrip(".") else HIDDEN_NAME
            seq.append((head, head + _BLOCK + size, f"the member {name[:80]!r}, which has {why}: webdataset and DALI "
                        "group members by key.extension and leave it out, so gpubatch does too", name))
            current = None
            continue
        if ke[0] != current:
            seq.append((s, ke[0], []))
            current = ke[0]
        seq[-1][2].append((ke[1], off, size, name))
    sets = Counter(frozenset(m[0] for m in x[2]) for x in seq if len(x[2]) and not isinstance(x[2], str))
    groups = sum(sets.values())
    typical, n = sets.most_common(1)[0] if sets else (frozenset(), 0)
    usual = typical if n * 2 > groups else frozenset()

    def lacking(item: Any) -> bool:
        return isinstance(item[2], list) and bool(usual - {m[0] for m in item[2]})

    out: list[Any] = []
    damaged: set[int] = set()
    for i, item in enumerate(seq):
        if isinstance(item[2], list) or len(item) == 4:
            continue
        start, end, what = item
        near = [k for k in (i - 1, i + 1) if 0 <= k < len(seq) and lacking(seq[k])]
        for k in near:
            damaged.add(k)
        if not near:
            damaged.add(i)
    for i, item in enumerate(seq):
        if isinstance(item[2], list):
            if i not in damaged:
                out.append((item[0], item[1], tuple(item[2])))
                continue
            stretch = seq[i + 1] if i + 1 < len(seq) and len(seq[i + 1]) == 3 and isinstance(seq[i + 1][2], str) \
                else seq[i - 1]
            if out and isinstance(out[-1], Damaged) and out[-1].key == item[1]:
                continue  # the same sample on both sides of the stretch: one damaged record
            has = ", ".join(sorted(m[0] for m in item[2]))
            out.append(Damaged(item[1], f"{tar}#{item[1]}", f"members of this sample lay in a damaged stretch of the "
                               f"shard (bytes {stretch[0]:,}-{stretch[1]:,}): it holds {has}, the shard's samples "
                               f"hold {', '.join(sorted(usual))}"))
        elif len(item) == 4:
            out.append(Damaged(f"{tar.name}#{item[3]}", f"{tar}#{item[3]}", item[2]))
        elif i in damaged:
            start, end, what = item
            out.append(Damaged(f"{tar.name}@{start}", f"{tar}@{start}",
                               f"damaged shard: bytes {start:,}-{end:,} hold {what}; the members there are lost"))
    return out


def _index_rows(tar: Path) -> tuple[int, list[list[str]]] | None:
    """The DALI index beside ``tar``: (fields a member, each sample's fields), ``v1.2 N`` then ``ext offset
    size name ...`` a sample (4 a member), or v1.1's ``ext offset size ...`` (3); None where there is no
    readable index, or its header's count or a line's fields do not add up."""
    idx = tar.with_suffix(".idx")
    try:
        lines = read_regular(idx, 1 << 30).decode("utf-8").splitlines()
        head = lines[0].split()
        width = 4 if head[0] == "v1.2" else 3 if head[0] == "v1.1" else 0
        rows = [parts for parts in (ln.split() for ln in lines[1:]) if parts]
        if not width or len(head) < 2 or int(head[1]) != len(rows) or any(len(p) % width for p in rows):
            return None
        return width, rows
    except (OSError, ValueError, IndexError, UnicodeError):
        return None


def _index_samples(tar: Path) -> list[tuple[str, int]] | None:
    """(key, offset of its first member's data) of every sample the DALI index beside ``tar`` lists (v1.1's
    samples, which name no member, keyed by offset), or None where there is no readable index."""
    found = _index_rows(tar)
    if found is None:
        return None
    width, rows = found
    out = []
    try:
        for p in rows:
            ke = split_member(p[3]) if width == 4 else None
            out.append((ke[0] if ke else f"{tar.name}@{int(p[1])}", int(p[1])))
    except ValueError:
        return None
    return out


def _not_found(tar: Path, found: list, members: list[tuple[str, int, int, int]]) -> list[tuple[str, str]]:
    """(key, reason) of each sample the index beside ``tar`` lists past the last member the scan read whole:
    what a tar cut short on a member boundary lost."""
    listed = _index_samples(tar)
    if not listed:
        return []
    known = {e.key if isinstance(e, Damaged) else e[1] for e in found}
    last = max((off + size for _, off, size, _ in members), default=0)
    size = tar.stat().st_size
    return [(key, f"the shard's index {tar.with_suffix('.idx').name} lists this sample at byte {off:,}, but the "
             f"shard ends at byte {size:,}: it is cut short and the sample is lost")
            for key, off in listed if off >= last and key not in known]


def header_holds(block: bytes, name: str, size: int) -> bool:
    """Whether ``block`` is the tar header of member ``name`` of ``size`` bytes: its checksum holds, its size
    field says ``size``, and its name field, where it is whole and ASCII, ends ``name`` (a class tar's member
    is named under its class; a long name's field is cut, a pax one's is not its name). What a member read by
    an index's offset is checked by: an index that lies about a member is never read as if it told the truth."""
    if len(block) != _BLOCK:
        return False
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) < 100 and block[124:136] == b"%011o\0" % size and block[: len(raw) + 1] == raw + b"\0":
        return True  # (as gpubatch, tarfile and GNU tar write them: the member's own header)
    if block[124] & 0x80:  # (a base-256 size: past any record's bound)
        return False
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip() or b"x", 8)
        held = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return False
    if held != size or stored != sum(block) - sum(block[148:156]) + 8 * 32:
        return False
    field = block[:100].split(b"\0", 1)[0]
    return len(field) >= 99 or not name.isascii() or name.encode("ascii").endswith(field)


def indexed_samples(tar: Path) -> list[tuple[int, str, tuple]] | None:
    """The samples of a shard gpubatch wrote, from the DALI v1.2 index beside it instead of a walk over its
    headers ((key, members) as :func:`_samples` gives them, ``s`` left 0 for the caller), or None where the
    index cannot stand for the shard: none, older than the tar, unreadable, a sample whose members do not
    share its key, members that run past the tar's end or leave more than its end-of-archive padding after
    them, or a first or last member whose header does not name it."""
    try:
        st = os.stat(tar)
        if older(tar.with_suffix(".idx").stat(), st):
            return None
    except OSError:
        return None
    found = _index_rows(tar)
    if found is None or found[0] != 4:
        return None
    out: list[tuple[int, str, tuple]] = []
    end = 0
    try:
        for parts in found[1]:
            members = tuple((parts[k], int(parts[k + 1]), int(parts[k + 2]), parts[k + 3]) for k in range(0, len(parts), 4))
            key = members[0][3][: -len(members[0][0]) - 1]
            if any(name != f"{key}.{ext}" for ext, _, _, name in members):
                return None
            end = max(end, max(off + size for _, off, size, _ in members))
            out.append((0, key, members))
    except ValueError:
        return None
    padded = end + -end % _BLOCK
    if not out or not 2 * _BLOCK <= st.st_size - padded < 2 * _BLOCK + 20 * _BLOCK:  # (the end: 2 zero blocks, a record's padding)
        return None
    for _, _, members in (out[0], out[-1]):
        _, off, _, name = members[0]
        raw = name.encode("utf-8")
        if len(raw) < 100 and read_range(tar, off - _BLOCK, len(raw) + 1) != raw + b"\0":
            return None
    return out


def gnu_header(name: str, size: int, mtime: int) -> bytes:
    """The 512-byte GNU tar header of a regular file (mode 0644, uid and gid 0, no user names), the bytes
    ``tarfile.TarInfo.tobuf(GNU_FORMAT)`` makes, built here at a tenth of its cost; a name beyond 100 bytes
    (or not ASCII), or a size of 8 GiB or more, goes through tarfile (its GNU long-name member, its base-256
    size)."""
    raw = name.encode("ascii", "strict") if name.isascii() else b""
    if not raw or len(raw) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, mtime, 0o644
        info.uname = info.gname = ""
        return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    sizes = b"%011o\x00" % size
    head, tail, fixed = _header_parts(mtime)
    # the checksum: every byte of the header summed, its own field counted as spaces
    check = b"%06o\x00 " % (fixed + sum(raw) + sum(sizes))
    return b"".join((raw, bytes(100 - len(raw)), head, sizes, tail[:12], check, tail[12:]))


@functools.lru_cache(maxsize=8)
def _header_parts(mtime: int) -> tuple[bytes, bytes, int]:
    """What every header of :func:`gnu_header` with this ``mtime`` holds around its name, size and checksum:
    the mode, uid and gid fields; the mtime field followed by the type, magic and the zeros after; the sum
    of those bytes and of the checksum field's eight spaces."""
    head = b"0000644\x000000000\x000000000\x00"
    tail = b"%011o\x00" % mtime + b"0" + bytes(100) + b"ustar  \x00" + bytes(247)
    return head, tail, sum(head) + sum(tail) + 8 * 0x20
