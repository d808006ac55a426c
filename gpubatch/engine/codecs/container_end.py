"""Where a video container's own structure says its file ends. A file cut short (a download or a copy stopped part
way) plays to the cut without an error in most players, and a pass-through would write it as whole; MP4 and MOV count
their frames in their index (``video_probe.sample_table``), the containers here do not, so their sizes and packet
lengths tell the cut instead, before a frame is read:

- Matroska/WebM: the Segment element's size (a live-written file's Segment has none: no cut can be told);
- FLV: each tag's length (the file ends inside one, or inside the 4 bytes of its size after it);
- ASF (WMV): the File Properties object's file size (not in a broadcast file);
- MXF: the header partition's offset of the footer partition; where a live-written header gives none, each KLV
  packet's length;
- MPEG-TS: its fixed packet size (the file ends inside a packet);
- MPEG-PS (.mpg, .vob): the lengths of the packets after its last pack header.

A stream format cut exactly between its packets (MPEG-TS, MPEG-PS, FLV) looks like a shorter file: that cut cannot be
told from the bytes. Sound files use it too (``audio_end.audio_shortfall``): Ogg pages and ADTS frames walked from the
file's tail (:func:`tail_end`), the sizes of AU, Wave64 and CAF headers (:func:`sound_end`), a chained Ogg file's
streams (:func:`ogg_chains`).

The structure also tells frames a demuxer passes over in a whole file: a Matroska file's blocks after the last one
its demuxer read, where it stopped at a damaged one (:func:`matroska_blocks_after`), and an AVI's empty index entries,
frames repeated to keep the rate rather than missing (:func:`avi_null_frames`); and the sound a re-encoded video's
copy would lose: the packets of a Matroska or FLV file's sound track (:func:`sound_packets`), the tracks its Tracks
element lists (:func:`matroska_tracks`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

#: how a cut is known: a size in the file's header (the frames it held are counted from its duration), or a packet
#: that runs past the file's end (the frames after it are not known)
HEADER, PACKET = "header", "packet"

_FLV_TAGS = (8, 9, 18)  # audio, video, script data
_ASF_FILE_PROPERTIES = bytes.fromhex("a1dcab8c47a9cf118ee400c00c205365")
_MXF_PARTITION = bytes.fromhex("060e2b34020501010d01020101")  # (a partition pack's key, its kind and status after)
_PS_TAIL = 1 << 18  # the bytes of an MPEG program stream's end searched for its last pack header
W64_RIFF = bytes.fromhex("726966662e91cf11a5d628db04c10000")  # (Sony Wave64's first GUID: a WAV of 64-bit sizes)


def declared_end(data: bytes, kind: str | None) -> tuple[int, str]:
    """(where the file ends by its container's structure, :data:`HEADER` or :data:`PACKET`) for video bytes of
    ``kind`` as ``video_probe.sniff_container`` names it; past ``len(data)`` in a file cut short; ``(0, "")`` where
    its structure tells nothing (another container, a live-written file, bytes it does not expect)."""
    try:
        if kind in ("mkv", "webm"):
            end = matroska_end(data)
            return (end, HEADER) if end else (0, "")
        if kind == "flv":
            return _flv_end(data)
        if kind == "wmv":
            return _asf_end(data)
        if kind == "mxf":
            return _mxf_end(data)
        if kind in ("ts", "m2ts"):
            size = 192 if kind == "m2ts" else 188
            return (len(data) + size - len(data) % size, PACKET) if len(data) % size else (0, "")
        if kind == "mpg":
            return _ps_end(data)
    except (IndexError, ValueError):  # (bytes that are not what their first ones said)
        pass
    return 0, ""


def _vint(data: bytes, at: int, keep_marker: bool) -> tuple[int, int, bool]:
    """An EBML variable-length integer at ``at``: (value, its bytes, all value bits set: an unknown size)."""
    first = data[at]
    n = 9 - first.bit_length() if first else 9
    if n > 8 or at + n > len(data):
        raise ValueError
    v = first if keep_marker else first & ((0x80 >> (n - 1)) - 1)
    for b in data[at + 1 : at + n]:
        v = (v << 8) | b
    return v, n, v == (1 << (7 * n)) - 1


def _segment(data: bytes) -> tuple[int, int, bool]:
    """(where a Matroska/WebM file's Segment element's data begins, its size, the size unknown); ValueError for
    another file."""
    ident, n, _ = _vint(data, 0, True)
    if ident != 0x1A45DFA3:
        raise ValueError
    size, m, _ = _vint(data, n, False)
    at = n + m + size  # (the EBML header's end: the Segment's ID)
    ident, n, _ = _vint(data, at, True)
    if ident != 0x18538067:
        raise ValueError
    size, m, unknown = _vint(data, at + n, False)
    return at + n + m, size, unknown


def matroska_end(data: bytes) -> int:
    """Where a Matroska/WebM file's Segment element says the file ends (written by any muxer that could seek back,
    FFmpeg's among them): past ``len(data)`` in a file cut short. 0 for no Matroska file, or a Segment of no size (a
    live-written file's: a cut cannot be told)."""
    try:
        at, size, unknown = _segment(data)
        return 0 if unknown else at + size
    except (ValueError, IndexError):
        return 0


def matroska_blocks_after(data: bytes, pos: int) -> int:
    """How many frame blocks (SimpleBlock, BlockGroup) of a Matroska/WebM file lie after ``pos``, the data of the
    last block a demuxer read, in its track: where the demuxer stopped at a damaged block, the frames after it are
    lost. The Segment's elements and each Cluster's are walked by their sizes; a stretch past ``pos`` that no walk
    reads counts one where every block read is of that track (another track's block may lie there). 0 where it
    cannot be told: no Matroska file, an element of no size (a live-written file)."""
    after = damaged = 0
    others = False  # (blocks of other tracks seen: a damaged stretch may be theirs)
    tracks: set[int] = set()  # (the Tracks element's track numbers: a block of none is a damaged one)
    try:
        track = _vint(data, pos, False)[0]
        at, size, unknown = _segment(data)
        end = len(data) if unknown else min(at + size, len(data))
        while at < end:
            try:
                ident, n, _ = _vint(data, at, True)
                size, m, unknown = _vint(data, at + n, False)
            except (ValueError, IndexError):
                ident = n = m = size = unknown = 0
            if ident not in _SEGMENT_KIDS or (ident != _CLUSTER and at + n + m + size > end):  # (a damaged
                # element: on at the next Cluster)
                at = _next_cluster(data, at + 1, end)
                continue
            if unknown:
                return 0
            inner, at = at + n + m, at + n + m + size
            if ident == _TRACKS:
                tracks |= set(_track_numbers(data, inner, min(at, len(data))))
            if ident != _CLUSTER or at <= pos:  # (a Cluster read whole, or another element)
                continue
            stop = min(at, len(data))
            while inner < stop:
                block = _block(data, inner, stop)
                if block:
                    number = _track(data, inner, block[1], stop)
                    if tracks and number not in tracks:  # (its track number damaged: a frame no demuxer gives)
                        damaged += inner > pos
                    else:
                        after += number == track and inner + block[1] > pos
                        others |= number != track
                    inner += block[0]
                    continue
                try:  # (another child: a Timecode, a Void...)
                    kid, n, _ = _vint(data, inner, True)
                    size, m, _ = _vint(data, inner + n, False)
                    if inner + n + m + size > stop or kid not in _CLUSTER_KIDS:
                        raise ValueError
                    inner += n + m + size
                except (ValueError, IndexError):  # (a damaged element: one more, then the next whole block)
                    damaged += inner > pos
                    inner = _next_block(data, inner + 1, stop)
    except (ValueError, IndexError):  # (bytes no element: the walk ends there, with what it found)
        pass
    return after + (0 if others else damaged)


def matroska_tracks(data: bytes) -> int:
    """How many TrackEntries a Matroska/WebM file's Tracks element lists (0 where it cannot be told): a demuxer
    makes no stream of one whose header the damage made unreadable (its TrackType or CodecID changed), and its
    sound is then lost with no word from the demuxer."""
    try:
        for ident, inner, stop in _segment_kids(data):
            if ident == _CLUSTER:  # (Tracks come before the first Cluster)
                return 0
            if ident == _TRACKS:
                return sum(kid == 0xAE for kid, _, _ in _kids(data, inner, stop))
    except (ValueError, IndexError):
        pass
    return 0


def _segment_kids(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(ID, where its data begins, where it ends) of each child of a Matroska/WebM file's Segment, walked by their
    sizes; ValueError at one of no size (a live-written file's) or of an ID no Segment child has (damage)."""
    at, size, unknown = _segment(data)
    end = len(data) if unknown else min(at + size, len(data))
    for ident, inner, stop in _kids(data, at, end):
        if ident not in _SEGMENT_KIDS or stop < 0:
            raise ValueError
        yield ident, inner, stop


def _kids(data: bytes, at: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """(ID, where its data begins, where it ends; -1: a size unknown) of each EBML element from ``at`` to ``stop``,
    walked by their sizes (ValueError, IndexError: bytes that are no element)."""
    while at < stop:
        ident, n, _ = _vint(data, at, True)
        size, m, unknown = _vint(data, at + n, False)
        yield ident, at + n + m, -1 if unknown else at + n + m + size
        at += n + m + size


def _track_numbers(data: bytes, at: int, stop: int) -> dict[int, int]:
    """The TrackNumber of each TrackEntry of a Tracks element's data ``at``..``stop``, and its TrackType (1 video,
    2 sound; 0 where the entry gives none)."""
    out = {}
    try:
        for ident, inner, end in _kids(data, at, stop):
            number = kind = 0
            for kid, value_at, value_end in (_kids(data, inner, min(end, stop)) if ident == 0xAE else ()):
                if kid in (0xD7, 0x83) and 0 < value_end - value_at <= 8:
                    value = int.from_bytes(data[value_at:value_end], "big")
                    number, kind = (value, kind) if kid == 0xD7 else (number, value)
            if number:
                out[number] = kind
    except (ValueError, IndexError):
        pass
    return out


def sound_packets(data: bytes, kind: str | None) -> int:
    """How many packets the first sound track of a Matroska/WebM or FLV file holds, by its structure: its blocks'
    frames (laced ones counted), blocks of no known track among them (a damaged track number); FLV's sound tags but
    AAC's header, tags of no known kind among them. A demuxer passes over a damaged block or tag with no word, and
    the sound copied beside a re-encoded video is then short. 0 where it cannot be told (another container, no
    sound track, an element of no size, a damaged element)."""
    try:
        if kind in ("mkv", "webm"):
            return _matroska_sound(data)
        if kind == "flv" and data[:3] == b"FLV":
            at, count = int.from_bytes(data[5:9], "big") + 4, 0
            while at + 11 <= len(data):
                tag, size = data[at] & 0x1F, int.from_bytes(data[at + 1 : at + 4], "big")
                if at + 15 + size > len(data):  # (a damaged size: no count)
                    return 0
                # (a tag of no FLV kind is a damaged one, which no demuxer gives: counted as sound)
                count += tag not in _FLV_TAGS or (tag == 8 and size > 0 and not (data[at + 11] >> 4 == 10
                                                                                  and data[at + 12] == 0))
                at += 11 + size + 4
            return count
    except (ValueError, IndexError):
        pass
    return 0


def _matroska_sound(data: bytes) -> int:
    """:func:`sound_packets` of a Matroska/WebM file: its Segment's elements and each Cluster's walked by their
    sizes, to the end or to the first damaged one (ValueError, IndexError: no count)."""
    tracks: dict[int, int] = {}
    count = 0
    for ident, inner, end in _segment_kids(data):
        if ident == _TRACKS:
            tracks = _track_numbers(data, inner, end)
        if ident != _CLUSTER:
            continue
        sound = next((k for k, v in tracks.items() if v == 2), None)
        if sound is None:
            return 0
        stop = min(end, len(data))
        while inner < stop:
            block = _block(data, inner, stop)
            if block:
                number = _track(data, inner, block[1], stop)
                if number == sound or number not in tracks:
                    count += _block_frames(data, inner, block[1], stop)
                inner += block[0]
                continue
            kid, n, _ = _vint(data, inner, True)
            size, m, _ = _vint(data, inner + n, False)
            if kid not in _CLUSTER_KIDS or inner + n + m + size > stop:
                return 0
            inner += n + m + size
    return count


def _block_frames(data: bytes, at: int, head: int, stop: int) -> int:
    """The frames of the block at ``at``: 1, or a laced block's count (the byte after its flags, plus one)."""
    inner = at + head
    if data[at] == 0xA0:  # (a BlockGroup: its Block)
        inner = next((block for kid, block, _ in _kids(data, inner, stop) if kid == 0xA1), -1)
        if inner < 0:
            return 1
    k = _vint(data, inner, False)[1]
    flags = data[inner + k + 2]
    return data[inner + k + 3] + 1 if flags & 0x06 else 1


def _track(data: bytes, at: int, head: int, stop: int) -> int | None:
    """The track number of the block at ``at`` (a SimpleBlock's, or its BlockGroup's Block's), None if unread."""
    try:
        if data[at] == 0xA3:
            return _vint(data, at + head, False)[0]
        inner = at + head
        while inner < stop:  # (a BlockGroup's children: its Block, a BlockDuration, references...)
            kid, n, _ = _vint(data, inner, True)
            size, m, _ = _vint(data, inner + n, False)
            if kid == 0xA1:
                return _vint(data, inner + n + m, False)[0]
            inner += n + m + size
    except (ValueError, IndexError):
        pass
    return None


_CLUSTER_KIDS = (0xE7, 0xA7, 0xAB, 0x5854, 0xEC, 0xBF)  # (Timecode, Position, PrevSize, SilentTracks, Void, CRC-32)
_CLUSTER = 0x1F43B675
_TRACKS = 0x1654AE6B
#: a Segment's children: SeekHead, Info, Tracks, Cues, Chapters, Tags, Attachments, Cluster, Void, CRC-32
_SEGMENT_KIDS = (0x114D9B74, 0x1549A966, 0x1654AE6B, 0x1C53BB6B, 0x1043A770, 0x1254C367, 0x1941A469, _CLUSTER, 0xEC,
                 0xBF)


def _next_cluster(data: bytes, at: int, end: int) -> int:
    """Where the next Cluster of a Segment begins from ``at`` (a walk past a damaged element): its ID, a size within
    the Segment and a Timecode, Void or CRC-32 first; ``end`` where there is none."""
    while (at := data.find(b"\x1f\x43\xb6\x75", at, end)) >= 0:
        try:
            size, m, unknown = _vint(data, at + 4, False)
            if (unknown or at + 4 + m + size <= end) and data[at + 4 + m] in (0xE7, 0xEC, 0xBF):
                return at
        except (ValueError, IndexError):
            pass
        at += 1
    return end


def _block(data: bytes, at: int, stop: int, strict: bool = False) -> tuple[int, int] | None:
    """(its length, where its data begins) for a frame block (SimpleBlock, BlockGroup) at ``at`` that ends within
    ``stop``; ``strict`` (a walk that lost its way, where such bytes may lie inside a block's data by chance): a
    SimpleBlock's track number of one byte, and the Cluster's end or another block, or two, right after it. None
    otherwise."""
    if data[at] not in (0xA3, 0xA0):
        return None
    try:
        size, m, _ = _vint(data, at + 1, False)
        end = at + 1 + m + size
        if end > stop:
            return None
        if strict and end < stop:
            if data[at] == 0xA3 and data[at + 1 + m] < 0x81:
                return None
            after = _block(data, end, stop)
            if after is None or (end + after[0] < stop and _block(data, end + after[0], stop) is None
                                 and data[end + after[0]] not in (0xEC, 0xBF)):
                return None
    except (ValueError, IndexError):
        return None
    return end - at, 1 + m


def _next_block(data: bytes, at: int, stop: int) -> int:
    """Where the next whole frame block of a Cluster begins from ``at`` (a walk past a damaged element), or ``stop``."""
    while True:
        at = min((i for i in (data.find(b"\xa3", at, stop), data.find(b"\xa0", at, stop)) if i >= 0), default=stop)
        if at >= stop or _block(data, at, stop, strict=True):
            return at
        at += 1


def _flv_end(data: bytes) -> tuple[int, str]:
    """An FLV file: its tags walked (11 bytes of header, their data, then 4 of that tag's size); one that runs past
    the end, its size's 4 bytes included (the spec ends a file with them, and FFmpeg writes them). A tag of a type FLV
    does not have ends the walk (no judgement). The ``filesize`` its ``onMetaData`` may hold is not taken: tools that
    cut or join FLV files copy it unchanged."""
    n = len(data)
    if data[:3] != b"FLV" or n < 9:
        return 0, ""
    at = int.from_bytes(data[5:9], "big") + 4  # (the header's length, then the first previous-tag size)
    while at < n:
        if at + 11 > n:
            return at + 11, PACKET
        kind, size = data[at] & 0x1F, int.from_bytes(data[at + 1 : at + 4], "big")
        if kind not in _FLV_TAGS:
            return 0, ""
        at += 11 + size + 4  # (a whole file ends with its last tag's size: a file cut inside those 4 bytes is cut)
        if at > n:
            return at, PACKET
    return 0, ""


def flv_told(data: bytes) -> tuple[float, float]:
    """(the duration an FLV file's ``onMetaData`` declares, the last sound tag's time), in seconds; (0, 0) where it
    declares none (a live-written file: FFmpeg's muxer writes it when it can seek back). A file cut exactly between
    two tags reads as a shorter whole one, but for this duration: its frames end well before it
    (``video_probe.probe`` compares them, its sound's last tag beside its frames). The first tag is read for the
    one, and the last tags, back from the end by the size each is followed by, for the other: no walk of the file."""
    if data[:3] != b"FLV" or len(data) < 9:
        return 0.0, 0.0
    told = sound = 0.0
    first = int.from_bytes(data[5:9], "big") + 4
    if first + 11 <= len(data) and data[first] & 0x1F == 18:  # (script data: onMetaData, an AMF0 array)
        size = int.from_bytes(data[first + 1 : first + 4], "big")
        i = data.find(b"\x00\x08duration\x00", first + 11, min(first + 11 + size, len(data)))
        if i >= 0 and i + 19 <= len(data):
            value = struct.unpack(">d", data[i + 11 : i + 19])[0]
            told = value if 0 < value < 1e7 else 0.0  # (NaN or a hostile figure: no judgement)
    end = len(data)
    for _ in range(64):  # (a sound that outlasts the video is in the last tags)
        at = end - 4 - int.from_bytes(data[end - 4 : end], "big")
        if at < first or data[at] & 0x1F not in _FLV_TAGS or 11 + int.from_bytes(data[at + 1 : at + 4], "big") != end - 4 - at:
            break  # (no tag there: a damaged end)
        if data[at] & 0x1F == 8:
            sound = ((data[at + 7] << 24) | int.from_bytes(data[at + 4 : at + 7], "big")) / 1000
            break
        end = at
    return told, sound


def _asf_end(data: bytes) -> tuple[int, str]:
    """An ASF (WMV) file: its header object's File Properties object's file size, unless its broadcast flag says
    that size is not known."""
    end = min(len(data), int.from_bytes(data[16:24], "little"))
    at = 30  # (the header object's GUID, size, count of objects and two reserved bytes)
    while at + 24 <= end:
        size = int.from_bytes(data[at + 16 : at + 24], "little")
        if size < 24:
            return 0, ""
        if data[at : at + 16] == _ASF_FILE_PROPERTIES and at + 92 <= len(data):
            file_size = int.from_bytes(data[at + 40 : at + 48], "little")
            broadcast = int.from_bytes(data[at + 88 : at + 92], "little") & 1
            return (file_size, HEADER) if not broadcast and file_size > len(data) else (0, "")
        at += size
    return 0, ""


def _ber(data: bytes, at: int) -> tuple[int, int]:
    """A KLV packet's BER length at ``at``: (its value, the bytes it takes)."""
    first = data[at]
    if first < 0x80:
        return first, 1
    k = first & 0x7F
    if not 0 < k <= 8 or at + 1 + k > len(data):
        raise ValueError
    return int.from_bytes(data[at + 1 : at + 1 + k], "big"), 1 + k


def _mxf_end(data: bytes) -> tuple[int, str]:
    """An MXF file beginning with its header partition: the footer partition's offset it names (a closed file's),
    else each KLV packet walked to the end."""
    n = len(data)
    if data[:13] != _MXF_PARTITION or data[13] != 0x02:
        return 0, ""
    length, k = _ber(data, 16)
    value = 16 + k
    footer = int.from_bytes(data[value + 20 : value + 28], "big") if length >= 28 else 0
    if footer:  # (offsets count from the header partition, here the file's start)
        return (footer + 16, HEADER) if footer + 16 > n else (0, "")
    at = 0
    while at < n:
        if at + 17 > n:
            return at + 17, PACKET
        if data[at : at + 4] != b"\x06\x0e\x2b\x34":  # (not a key: bytes the walk does not know)
            return 0, ""
        if data[at + 16] > 0x80 and at + 17 + (data[at + 16] & 0x7F) > n:  # (its length's bytes cut)
            return at + 17 + (data[at + 16] & 0x7F), PACKET
        length, k = _ber(data, at + 16)
        at += 16 + k + length
    return (at, PACKET) if at > n else (0, "")


def _ps_end(data: bytes) -> tuple[int, str]:
    """An MPEG program stream: its packets walked from the last pack header (within its last 256 KiB); one whose
    length runs past the end. Bytes that are no start code end the walk (no judgement)."""
    n = len(data)
    at = data.rfind(b"\x00\x00\x01\xba", max(0, n - _PS_TAIL))
    while at >= 0 and not _pack_header(data, at):  # (a start code's bytes inside a payload)
        at = data.rfind(b"\x00\x00\x01\xba", max(0, n - _PS_TAIL), at)
    if at < 0:
        return 0, ""
    while at < n:
        if at + 6 > n:
            return at + 6, PACKET
        if data[at : at + 3] != b"\x00\x00\x01":
            return 0, ""
        code = data[at + 3]
        if code == 0xBA:
            if at + 14 > n:
                return at + 14, PACKET
            at += 14 + (data[at + 13] & 7) if data[at + 4] >> 6 == 1 else 12  # (MPEG-2's pack header, or MPEG-1's)
        elif code == 0xB9:  # (the program's end code)
            at += 4
        elif code >= 0xBB:  # (a system header or a PES packet: its length follows)
            at += 6 + int.from_bytes(data[at + 4 : at + 6], "big")
        else:
            return 0, ""
    return (at, PACKET) if at > n else (0, "")


def _pack_header(data: bytes, at: int) -> bool:
    """Whether a pack header's marker bits are where MPEG-2's (or MPEG-1's) put them."""
    b = data[at + 4 : at + 13]
    if len(b) < 9:
        return True  # (a pack header cut short: the walk tells it)
    if b[0] >> 6 == 1:  # MPEG-2: its clock's and its rate's markers
        return bool(b[0] & 0x04 and b[2] & 0x04 and b[4] & 0x04 and b[5] & 0x01) and b[8] & 0x03 == 3
    return b[0] >> 4 == 2 and bool(b[0] & 0x01 and b[2] & 0x01 and b[4] & 0x01 and b[5] & 0x80 and b[7] & 0x01)


def tail_end(tail: bytes, size: int, kind: str, starts: list[int] | None = None) -> int:
    """Where the last page (Ogg: ``kind`` "ogg") or frame (AAC in ADTS: "adts") of a ``size``-byte file ends, by a
    chain of them walked through its last bytes ``tail`` from the first one found there: past ``size`` in a file cut
    inside it, ``size`` in a whole one; 0 where no chain is found (bytes the walk does not know, a tag after the
    frames). A chain must hold two pages or frames, or start at the file's start, to be taken: the four bytes of
    a page's capture pattern, or a frame's sync word, may occur inside a payload. ``starts`` gets where in ``tail``
    each page or frame of the chain taken begins."""
    start = size - len(tail)
    find = (lambda at: tail.find(b"OggS", at)) if kind == "ogg" else (lambda at: _adts_sync(tail, at))
    at = find(0)
    while at >= 0:
        pages: list[int] = []
        end = _chain(tail, at, kind, start + at == 0, pages)
        if end:
            if starts is not None:
                starts[:] = pages
            return start + end
        at = find(at + 1)
    return 0


def adts_at(data: bytes, at: int = 0) -> bool:
    """Whether an ADTS frame header (AAC as a raw stream, ``.aac``) begins at ``at``: 12 bits of sync and layer 0,
    where MPEG audio (MP3) has a layer."""
    return at + 1 < len(data) and data[at] == 0xFF and data[at + 1] & 0xF6 == 0xF0


def _adts_sync(tail: bytes, at: int) -> int:
    """The next ADTS frame header's position from ``at``, or -1."""
    at = tail.find(b"\xff", at)
    while at >= 0 and not adts_at(tail, at):
        at = tail.find(b"\xff", at + 1)
    return at


def _chain(tail: bytes, at: int, kind: str, trusted: bool, pages: list[int]) -> int:
    """The end of the chain of pages or frames from ``at`` in ``tail`` (see :func:`tail_end`), or 0; ``pages`` gets
    where each begins."""
    n, links = len(tail), 0
    while True:
        pages.append(at)
        head = 27 if kind == "ogg" else 7  # (a page's header before its segment table; an ADTS header)
        if kind == "ogg" and (tail[at : at + 4] != b"OggS"[: n - at] or (at + 4 < n and tail[at + 4] != 0)):
            return 0
        if kind == "adts" and not (adts_at(tail, at) or (at + 1 == n and tail[at] == 0xFF)):  # (or its first byte)
            return 0
        if at + head > n:  # (the file ends inside its header)
            return at + head if links or trusted else 0
        if kind == "ogg":
            segments = tail[at + 26]
            if at + head + segments > n:
                return at + head + segments if links or trusted else 0
            end = at + head + segments + sum(tail[at + head : at + head + segments])
        else:
            end = at + (((tail[at + 3] & 0x03) << 11) | (tail[at + 4] << 3) | (tail[at + 5] >> 5))
            if end < at + head:
                return 0
        links += 1
        if end >= n:
            return end if links > 1 or trusted else 0
        at = end


def sound_end(head: bytes, kind: str | None) -> int:
    """Where an AU, W64 or CAF sound file (``kind`` as ``audio_io.sniff_audio`` names it) ends by its header: its
    data's offset and size, the whole file's size, its chunks' sizes up to its ``data`` chunk; 0 where it does not say
    (an AU or CAF data size left unknown, as a stream writer leaves it). libsndfile reads such a file to its cut
    without a word."""
    if kind == "au" and len(head) >= 12:
        order = "big" if head[:4] == b".snd" else "little"
        at, n = int.from_bytes(head[4:8], order), int.from_bytes(head[8:12], order)
        return 0 if n == 0xFFFFFFFF else at + n
    if kind == "w64" and len(head) >= 24:
        end = int.from_bytes(head[16:24], "little")
        return end if end > 24 else 0
    if kind == "caf":
        at = 8
        while at + 12 <= len(head):
            n = int.from_bytes(head[at + 4 : at + 12], "big", signed=True)
            if head[at : at + 4] == b"data":
                return 0 if n < 0 else at + 12 + n
            if n < 0:
                return 0
            at += 12 + n
        return 0  # (its data chunk lies beyond the first bytes read: not told)
    return 0


def ogg_last_sample(head: bytes, tail: bytes) -> int | None:
    """The sample an Ogg file's last page ends at (its granule position; an Opus stream's less its pre-skip, as its
    decoders count), from its first bytes ``head`` and its last ``tail``; None where no page header is found there;
    -1 where the last page belongs to another logical stream than the first (a chained file: streams one after
    another, of which libsndfile reads the first alone)."""
    at = tail.rfind(b"OggS")
    while at >= 0 and (len(tail) < at + 18 or tail[at + 4] != 0):
        at = tail.rfind(b"OggS", 0, at)
    if at < 0:
        return None
    if head[:4] == b"OggS" and len(head) >= 18 and head[14:18] != tail[at + 14 : at + 18]:
        return -1
    granule = int.from_bytes(tail[at + 6 : at + 14], "little", signed=True)
    opus = head.find(b"OpusHead")
    if 0 <= opus < 256 and len(head) >= opus + 12:
        granule -= int.from_bytes(head[opus + 10 : opus + 12], "little")
    return granule if granule > 0 else None


#: the first bytes of an Ogg stream of another kind than Vorbis or Opus (Skeleton's index, FLAC, Speex, Theora...):
#: such a stream is no damaged one, and holds no sound gpubatch's Ogg reading takes
_OGG_OTHER = (b"fishead\x00", b"fisbone\x00", b"\x7fFLAC", b"Speex   ", b"\x80theora", b"\x80kate", b"PCM     ",
              b"CELT    ", b"\x01video", b"\x01text", b"BBCD\x00", b"CMML\x00", b"\x8bDirac", b"OVP80", b"fLaC")


def ogg_chains(data: bytes) -> list[tuple[int, int, int, int]]:
    """(rate, channels, samples, where its first page begins) of each logical stream of a chained Ogg file (Vorbis
    or Opus streams one after another), walking its pages: a stream's samples are its last page's granule position
    (an Opus stream's less its pre-skip; Opus decodes at 48 kHz). A damaged stretch is passed over to the next
    page. A stream of sound whose identification header no page gives (its first page damaged, or missing) has
    rate and channels 0: its samples cannot be read. Streams of other kinds (a Skeleton index...) are left out."""
    chains: dict[int, list] = {}  # serial -> [rate, channels, last granule, pre-skip, first page, of another kind]
    at = 0
    while 0 <= at and at + 27 <= len(data):
        if data[at : at + 4] != b"OggS" or data[at + 4] != 0:
            at = data.find(b"OggS", at + 1)
            continue
        segments = data[at + 27 : at + 27 + data[at + 26]]
        body = at + 27 + len(segments)
        serial = int.from_bytes(data[at + 14 : at + 18], "little")
        granule = int.from_bytes(data[at + 6 : at + 14], "little", signed=True)
        chain = chains.setdefault(serial, [0, 0, 0, 0, at, False])
        if data[at + 5] & 2 and not chain[0]:  # (a stream's first page: its identification header)
            head = data[body : body + 30]
            if head[:8] == b"OpusHead":
                chain[:4] = [48000, head[9], 0, int.from_bytes(head[10:12], "little")]
            elif head[:7] == b"\x01vorbis":
                chain[:4] = [int.from_bytes(head[12:16], "little"), head[11], 0, 0]
            elif head.startswith(_OGG_OTHER):
                chain[5] = True
        if granule > 0:
            chain[2] = granule
        at = body + sum(segments)
    return [(rate, channels, max(0, last - skip), first) for rate, channels, last, skip, first, other in chains.values()
            if not other and (rate or last > 0)]


def avi_null_frames(data: bytes, stream: int) -> int:
    """How many of an AVI file's index entries (``idx1``) for video stream ``stream`` are empty: the frames a
    writer repeats to keep a constant rate (FFmpeg's muxer writes one where timestamps skip, VirtualDub one for each
    dropped frame). The stream's length counts them and no demuxer gives a packet for them: they are neither lost
    nor missing. 0 where there is no ``idx1`` (an OpenDML file's second part, say)."""
    if data[:4] != b"RIFF" or data[8:12] != b"AVI ":
        return 0
    at = 12
    while at + 8 <= len(data):  # (the RIFF's chunks: hdrl, movi, idx1...)
        size = int.from_bytes(data[at + 4 : at + 8], "little")
        if data[at : at + 4] == b"idx1":
            table = data[at + 8 : min(at + 8 + size, len(data))]
            names = (b"%02ddc" % stream, b"%02ddb" % stream)
            return sum(1 for i in range(0, len(table) - 15, 16)
                       if table[i : i + 4] in names and not int.from_bytes(table[i + 12 : i + 16], "little"))
        at += 8 + size + (size & 1)
    return 0

