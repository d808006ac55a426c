"""FLAC decoded on the GPU: the host finds each frame in the stream (:func:`pack`, a few hundred microseconds a
10-s clip, in the decoding processes), the GPU decodes every frame of a batch at once, a thread a frame
(``kernels/flac.cu``), into float32 exactly as libsndfile gives them (the CPU path's decode).

Decoding FLAC on the CPU is what bounds audio on a GPU host: libsndfile takes 2.3-3.8 ms of a core for a 10-s
16 kHz clip, and a 16-core host's every core decoding and nothing else reaches about 4,700 such clips a second
(benchmarks/RESULTS.md). The frames of a FLAC stream are independent (each has its header, its subframes and a
CRC-16), so they decode in parallel: the host only reads the stream's STREAMINFO and the frames' headers.

Anything the GPU path does not take is decoded on the CPU as before, record by record, so outputs and errors are
the CPU path's: a stream :func:`pack` does not place whole (no ``fLaC`` at its start, no sample count in its
STREAMINFO, a depth other than 8, 16 or 24 bits, frames that do not chain to its sample count), and a record any
of whose frames the GPU refuses (a header or frame CRC that does not match, a frame that does not end where the
next begins, a subframe it cannot read: ``status``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .audio_io import AudioData, AudioInfo, _check

#: columns of the kernel's per-frame table (kernels/flac.cu: FLAC_COLS)
COLS = 7
#: bytes the kernel may read past a batch's last frame (it reads aligned words)
PAD = 16
#: the depths the GPU path takes (libsndfile's float32 is then x / 2^(bps-1), exact)
DEPTHS = (8, 16, 24)


class FlacPacked(NamedTuple):
    """A FLAC record's bytes placed for the GPU, as :class:`AudioData`'s ``samples``: ``data`` the whole
    file's bytes (uint8; where they lie in a shared file between processes, its place there), ``frames`` the
    frames to decode (int64 rows: byte start, byte end, first sample, block size), ``keep`` the samples a channel
    asked (the decoded frames may hold a few more) of the stream's ``total``, ``key``/``origin`` the record's (an error found on the GPU names them)."""

    data: Any
    frames: np.ndarray
    channels: int
    bps: int
    keep: int
    total: int
    key: str = ""
    origin: str = ""

    @property
    def shape(self) -> tuple[int, int]:
        """(channels, samples) of the decoded record, as a waveform's ``samples.shape``."""
        return self.channels, self.keep

    @property
    def decoded(self) -> int:
        """Samples a channel the table's frames hold."""
        return int(self.frames[-1, 2] + self.frames[-1, 3])

    @property
    def last(self) -> bool:
        """Whether the table's last frame is the stream's (it may end before the bytes do: a tag after it)."""
        return self.decoded == self.total

    @property
    def nbytes(self) -> int:
        """The bytes' length (in memory, or where they lie in a shared file: its shape and type)."""
        d = self.data
        if isinstance(d, np.ndarray):
            return int(d.nbytes)
        return int(np.prod(d.shape)) * np.dtype(d.dtype).itemsize


def is_packed(d: Any) -> bool:
    return isinstance(getattr(d, "samples", None), FlacPacked)


def _crc8_table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else (c << 1) & 0xFF
        out.append(c)
    return out


_CRC8 = _crc8_table()
_BLOCK = {1: 192, 2: 576, 3: 1152, 4: 2304, 5: 4608, **{c: 256 << (c - 8) for c in range(8, 16)}}


def _header(b: np.ndarray, at: int, n: int) -> tuple[int, int] | None:
    """(coded number, block size) of a frame header at ``at``, None where it is not one (its CRC-8 checked: a
    stream's bytes hold the sync code here and there; the GPU checks the frames' own CRC-16 too)."""
    if at + 6 > n:
        return None
    b2, b3 = int(b[at + 2]), int(b[at + 3])
    bs_code, sr_code, assign, ss_code = b2 >> 4, b2 & 15, b3 >> 4, (b3 >> 1) & 7
    if bs_code == 0 or sr_code == 15 or assign > 10 or ss_code == 3 or b3 & 1:
        return None
    p = at + 4
    lead = int(b[p])
    if lead < 0x80:
        num, more = lead, 0
    elif 0xC0 <= lead < 0xFE:
        more = 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3 if lead < 0xF8 else 4 if lead < 0xFC else 5
        num = lead & (0x3F >> more)
    elif lead == 0xFE:
        num, more = 0, 6
    else:
        return None
    if p + 1 + more + 2 > n:
        return None
    for i in range(1, more + 1):
        c = int(b[p + i])
        if c & 0xC0 != 0x80:
            return None
        num = (num << 6) | (c & 0x3F)
    p += 1 + more
    if bs_code == 6:
        bs = int(b[p]) + 1
        p += 1
    elif bs_code == 7:
        bs = (int(b[p]) << 8 | int(b[p + 1])) + 1
        p += 2
    else:
        bs = _BLOCK[bs_code]
    p += 1 if sr_code == 12 else 2 if sr_code in (13, 14) else 0
    if p >= n:
        return None
    crc = 0
    for c in b[at:p].tobytes():
        crc = _CRC8[crc ^ c]
    if crc != int(b[p]):
        return None
    return num, bs


def stream_info(b: np.ndarray) -> tuple[AudioInfo, int] | None:
    """A FLAC stream's facts (:class:`AudioInfo` of its STREAMINFO) and where its first frame may begin (after its
    metadata blocks), from its bytes ``b`` (uint8); None where the GPU path does not take it (no ``fLaC`` at its start,
    a depth other than those of :data:`DEPTHS`, no sample count): the CPU path then decodes it, or says why it
    cannot."""
    n = len(b)
    if n < 42 or bytes(b[:4]) != b"fLaC":
        return None
    at, info = 4, None
    while True:  # metadata blocks: STREAMINFO first
        if at + 4 > n:
            return None
        head = int(b[at])
        size = int(b[at + 1]) << 16 | int(b[at + 2]) << 8 | int(b[at + 3])
        if info is None:
            if head & 0x7F != 0 or size < 34 or at + 4 + 34 > n:
                return None
            s = bytes(b[at + 4: at + 4 + 34])
            rate = (s[10] << 12) | (s[11] << 4) | (s[12] >> 4)
            channels = ((s[12] >> 1) & 7) + 1
            bps = (((s[12] & 1) << 4) | (s[13] >> 4)) + 1
            total = ((s[13] & 15) << 32) | int.from_bytes(s[14:18], "big")
            info = AudioInfo("flac", {8: "PCM_S8", 16: "PCM_16", 24: "PCM_24"}.get(bps, ""), rate, channels, total, bps)
        at += 4 + size
        if head & 0x80:
            break
    if info.bits not in DEPTHS or info.frames <= 0:
        return None
    try:
        _check(info)
    except ValueError:
        return None
    return info, at


def frames_of(b: np.ndarray, at: int, total: int, want: int) -> np.ndarray | None:
    """The frames of a stream of ``total`` samples a channel whose first frame may begin at ``at``, as many as hold its
    first ``want``: int64 rows (byte start, byte end, first sample, block size). A frame is the sync code, then a
    header whose coded number is the next one expected. None where they do not chain to ``want`` samples."""
    n = len(b)
    region = b[at:]
    cands = np.flatnonzero((region[:-1] == 0xFF) & ((region[1:] & 0xFE) == 0xF8)) + at
    block = 0
    rows: list[list[int]] = []
    sample, index = 0, 0
    variable = None
    for c in cands.tolist():
        if rows and c < rows[-1][0] + 2:
            continue
        h = _header(b, c, n)
        if h is None:
            continue
        num, bs = h
        var = bool(b[c + 1] & 1)
        if variable is None:
            variable = var
        if var != variable or num != (sample if variable else index):
            continue
        if not variable and index == 0:
            block = bs
        if not variable and bs != block and sample + bs != total:  # (a fixed stream's short frame: its last only)
            continue
        if rows:
            rows[-1][1] = c
        if sample >= want:  # (the frame after the last one needed: where that one ends)
            break
        rows.append([c, n, sample, bs])
        sample += bs
        index += 1
    if not rows or sample < want or sample > total:
        return None
    if sample < total and rows[-1][1] == n:  # (no next frame found after the last one needed)
        return None
    return np.asarray(rows, np.int64)


def pack(data: Any, seconds: float | None = None, max_samples: int = 0, key: str = "", origin: str = "",
         ops: Any = None) -> AudioData | None:
    """A FLAC record's bytes placed for the GPU (an :class:`AudioData` whose ``samples`` is a :class:`FlacPacked`)
    for its first ``seconds`` (all where None); None where the GPU path does not take it, or where a chain of
    ``ops`` would stream it (a long record read whole: :func:`~.audio_stream.should_stream`, on the CPU). ValueError
    where the record holds more than ``max_samples`` samples, as the CPU path says. Its frames are walked once, as
    far as the samples asked."""
    from .audio_io import _frames_asked
    from .audio_stream import should_stream

    b = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    head = stream_info(b)
    if head is None:
        return None
    info, at = head
    if ops is not None and seconds is None and should_stream(ops, info):
        return None
    keep = _frames_asked(info, seconds, max_samples)
    rows = frames_of(b, at, info.frames, keep)
    if rows is None:
        return None
    return AudioData(FlacPacked(b, rows, info.channels, info.bits, keep, info.frames, key, origin), info.rate,
                     bits=24 if info.bits >= 24 else 16)


def decode_host(d: AudioData, data: Any = None) -> AudioData:
    """A packed record decoded on the CPU, as the CPU path decodes it (libsndfile; ``data`` its bytes where the
    packed ones are not at hand); ValueError as the CPU path raises it."""
    from .audio_io import decode_audio

    p = d.samples
    raw = bytes(p.data if data is None else data)
    # (the CPU path asked ceil(seconds * rate) samples; keep / rate asks keep, or one more, cut below)
    out = decode_audio(raw, None, 0, None if p.keep >= p.total else p.keep / d.rate)
    if out.samples.shape[-1] > p.keep:
        out = out._replace(samples=np.ascontiguousarray(out.samples[:, : p.keep]))
    return out


def table(items: list[tuple[int, FlacPacked]]) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The kernel's per-frame table for ``items`` ((byte offset of the item's bytes in the batch's buffer,
    packed)), and each item's (output offset, channels, decoded samples a channel), its outputs laid end to end."""
    frames = [p.frames for _, p in items]
    counts = np.array([len(f) for f in frames], np.int64)
    chans = np.array([p.channels for _, p in items], np.int64)
    nd = np.array([p.decoded for _, p in items], np.int64)
    outs = np.concatenate([[0], np.cumsum(chans * nd)[:-1]]).astype(np.int64)
    f = np.concatenate(frames) if frames else np.empty((0, 4), np.int64)
    t = np.empty((len(f), COLS), np.int64)
    offs = np.repeat(np.array([o for o, _ in items], np.int64), counts)
    t[:, 0] = f[:, 0] + offs
    t[:, 1] = f[:, 1] + offs
    t[:, 2] = np.repeat(outs, counts)
    t[:, 3] = f[:, 2]
    t[:, 4] = f[:, 3]
    t[:, 5] = np.repeat(nd, counts)
    t[:, 6] = np.repeat(chans | (np.array([p.bps for _, p in items], np.int64) << 8), counts)
    ends = np.cumsum(counts) - 1
    last = np.array([p.last for _, p in items], bool)
    t[ends[last], 6] |= 1 << 16
    return t, list(zip(outs.tolist(), chans.tolist(), nd.tolist()))


def decode_on_gpu(buf: Any, items: list[tuple[int, AudioData]], host: np.ndarray | None = None,
                  refused: list[int] | None = None) -> list[Any]:
    """Packed records decoded on the GPU: ``buf`` their bytes on the device (uint8, ``items``' offsets into it; its
    start 4-byte aligned and :data:`PAD` bytes readable past its last item: the kernel reads words),
    each item an :class:`AudioData` on the GPU again (float32 (channels, samples)); one whose frames the GPU
    refuses is decoded on the CPU (``host``: the same bytes on the host, else the item's own) and uploaded, or
    is a :class:`~gpubatch.errors.RecordError` where the CPU path cannot decode it either (its index in ``items``
    added to ``refused``, where given, either way)."""
    import cupy as cp

    from ...errors import RecordError, Stage
    from ..kernels import kernel

    if not items:
        return []
    t, places = table([(off, d.samples) for off, d in items])
    out = cp.empty(max(1, sum(c * nd for _, c, nd in places)), cp.float32)
    status = cp.empty(len(t), cp.int32)
    dev_t = cp.asarray(t)
    threads = 32
    kernel("flac", "flac_frames")(((len(t) + threads - 1) // threads,), (threads,),
                                  (buf, dev_t, out, status, np.int32(len(t))))
    st = status.get()
    res: list[Any] = []
    row = 0
    for (off, d), (o, c, nd) in zip(items, places):
        p = d.samples
        k = len(p.frames)
        if st[row: row + k].any():
            if refused is not None:
                refused.append(len(res))
            try:
                back = decode_host(d, None if host is None else host[off: off + p.nbytes])
                x = cp.asarray(back.samples)
                res.append(back._replace(samples=x))
            except ValueError as e:
                res.append(RecordError(p.key, p.origin, Stage.DECODE, str(e)))
        else:
            x = out[o: o + c * nd].reshape(c, nd)
            if nd != p.keep:
                x = x[:, : p.keep]
                if c > 1:
                    x = cp.ascontiguousarray(x)
            res.append(AudioData(x, d.rate, bits=d.bits))
        row += k
    return res


def decode_into(out: list, buf: Any, placed: list[tuple[int, int, AudioData]], host: np.ndarray | None = None) -> list[int]:
    """:func:`decode_on_gpu` over ``placed`` (``(index into out, byte offset into buf, item)``), each result put
    at its index of ``out``; returns the indexes (into ``out``) of the items whose frames the GPU refused."""
    refused: list[int] = []
    for (i, _, _), d in zip(placed, decode_on_gpu(buf, [(b, it) for _, b, it in placed], host, refused)):
        out[i] = d
    return [placed[k][0] for k in refused]
