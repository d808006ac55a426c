"""FLAC decoded on the GPU (codecs/flac_gpu.py, kernels/flac.cu): the host's frame finding, and the kernel's decode
compiled as C++ on the host (``FLAC_HOST``) and run frame by frame, against libsndfile's float32, bit for bit, over
streams of every kind libFLAC and FFmpeg write (depths, channel layouts, compression levels, silence, noise, wasted
bits, lengths that end mid-block, the first seconds only); damaged streams are refused, never decoded wrong. The
kernel itself on the GPU, and ``convert`` with and without it, are the ``gpu`` tests at the end."""

from __future__ import annotations

import ctypes
import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from gpubatch.engine.codecs import flac_gpu

from .sounds import write

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
KERNEL = Path(flac_gpu.__file__).resolve().parent.parent / "kernels" / "flac.cu"


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    """The kernel's decode built as a host library (``flac_frames_host``: every frame in turn). The streams below
    take both its 32-bit sums (16-bit LPC of libFLAC's usual orders, FIXED) and its 64-bit ones (24-bit LPC,
    FFmpeg's order-32 LPC)."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    so = tmp_path_factory.mktemp("flac") / "flac.so"
    subprocess.run([CXX, "-O2", "-shared", "-fPIC", "-DFLAC_HOST", "-x", "c++", str(KERNEL), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.flac_frames_host.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
    return lib


def _nvcc() -> str | None:
    import glob

    return shutil.which("nvcc") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))), None)


def test_the_kernel_compiles_for_the_gpu(tmp_path):
    """Where a CUDA toolkit is installed (no GPU needed), the kernel as NVRTC compiles it at run time (its guard
    defined, C++17) builds for Hopper with nvcc, with no register spills."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no CUDA toolkit (nvcc)")
    args = [nvcc, "-std=c++17", "-DKEEP_flac_frames", "-arch=sm_90", "-cubin",
            "-Xptxas", "-v", "-x", "cu", str(KERNEL), "-o", str(tmp_path / "flac.cubin")]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "0 bytes spill stores" in done.stderr


def decode(lib, data: bytes, seconds: float | None = None):
    """(per-frame status, float32 (channels, samples)) of ``data`` through the host-built kernel; None where
    :func:`flac_gpu.pack` does not take the stream."""
    d = flac_gpu.pack(data, seconds)
    if d is None:
        return None
    t, [(o, c, nd)] = flac_gpu.table([(0, d.samples)])
    buf = np.frombuffer(data + bytes(flac_gpu.PAD), np.uint8)  # (the kernel reads words past a frame's end)
    out = np.zeros(c * nd, np.float32)
    status = np.zeros(len(t), np.int32)
    lib.flac_frames_host(buf.ctypes.data, t.ctypes.data, out.ctypes.data, status.ctypes.data, len(t))
    return status, out.reshape(c, nd)[:, : d.samples.keep]


def signal(rng, n: int, channels: int, kind: str) -> np.ndarray:
    t = np.arange(n) / 16000
    if kind == "speech":
        x = 0.3 * np.sin(2 * np.pi * 220 * t * (1 + 0.1 * np.sin(t)))[:, None] + 0.05 * rng.standard_normal((n, channels))
        if channels > 1:  # (correlated channels: libFLAC picks left/side, right/side or mid/side per frame)
            x[:, 1] = 0.7 * x[:, 0] + 0.01 * rng.standard_normal(n)
    elif kind == "noise":  # (verbatim subframes, escape codes)
        x = rng.uniform(-1, 1, (n, channels))
    elif kind == "silence":  # (constant subframes)
        x = np.zeros((n, channels))
    else:  # "wasted": 24-bit samples whose low 8 bits are zero
        x = np.round(rng.standard_normal((n, channels)) * 1000) * 256 / (1 << 23)
    return np.clip(x, -1, 0.999)


def flac_bytes(x: np.ndarray, subtype: str, level: float | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, 16000, format="FLAC", subtype=subtype, **({} if level is None else {"compression_level": level}))
    return buf.getvalue()


def reference(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="float32", always_2d=True)[0].T


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "PCM_S8"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_the_kernels_decode_is_libsndfiles_bit_for_bit(host_kernel, subtype, channels):
    rng = np.random.default_rng(channels)
    for n in (1000, 4096, 48017, 160000):
        for level in (0.0, 0.5, 1.0):
            for kind in ("speech", "noise", "silence", "wasted"):
                data = flac_bytes(signal(rng, n, channels, kind), subtype, level)
                got = decode(host_kernel, data)
                assert got is not None, (n, level, kind)
                status, x = got
                assert not status.any() and np.array_equal(x, reference(data)), (n, level, kind, status)


def test_the_first_seconds_only(host_kernel):
    """A chain that reads the first seconds: the frames up to them decoded, cut to ``ceil(seconds * rate)``."""
    data = flac_bytes(signal(np.random.default_rng(1), 160000, 2, "speech"), "PCM_16", 0.5)
    ref = reference(data)
    for seconds in (0.01, 0.5, 1.0, 3.3, 9.99, 10.0, 30.0):
        d = flac_gpu.pack(data, seconds)
        keep = min(160000, int(np.ceil(seconds * 16000)))
        assert d.samples.shape == (2, keep) and d.size == (16000, keep)
        assert d.samples.last == (keep > 160000 - 4096)
        status, x = decode(host_kernel, data, seconds)
        assert not status.any() and np.array_equal(x, ref[:, :keep]), seconds
        assert np.array_equal(flac_gpu.decode_host(d).samples, ref[:, :keep])


def test_streams_ffmpeg_writes(host_kernel):
    """FFmpeg's encoder (other LPC orders and precisions, up to order 32 at level 12)."""
    av = pytest.importorskip("av")
    rng = np.random.default_rng(2)
    for level in (0, 5, 8, 12):
        for channels in (1, 2):
            x = np.round((0.3 * np.sin(np.arange(64000) / 7.0)[None].repeat(channels, 0)
                          + 0.02 * rng.standard_normal((channels, 64000))) * 32767).astype(np.int16)
            layout = "mono" if channels == 1 else "stereo"
            buf = io.BytesIO()
            with av.open(buf, "w", format="flac") as c:
                s = c.add_stream("flac", rate=16000, layout=layout)
                s.codec_context.options = {"compression_level": str(level)}
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x.T.reshape(1, -1)), format="s16", layout=layout)
                frame.sample_rate = 16000
                for p in [*s.encode(frame), *s.encode(None)]:
                    c.mux(p)
            data = buf.getvalue()
            status, y = decode(host_kernel, data)
            assert not status.any() and np.array_equal(y, reference(data)), (level, channels)


def test_damaged_streams_are_refused_never_decoded_wrong(host_kernel):
    """A bit flipped anywhere in the frames: the stream is not placed, or a frame's status names it (its CRC, its
    end...), so the record goes to the CPU path; a frame the kernel passes is libsndfile's, whatever was flipped."""
    rng = np.random.default_rng(3)
    data = flac_bytes(signal(rng, 64000, 2, "speech"), "PCM_16", 0.5)
    ref = reference(data)
    start = int(flac_gpu.pack(data).samples.frames[0, 0])
    refused = 0
    for _ in range(150):
        bad = bytearray(data)
        at = int(rng.integers(start, len(bad)))
        bad[at] ^= 1 << int(rng.integers(8))
        got = decode(host_kernel, bytes(bad))
        if got is None or got[0].any():
            refused += 1
        else:
            assert np.array_equal(got[1], ref)
    assert refused == 150  # (CRC-8 and CRC-16 catch every single-bit error)
    # cut short, or not FLAC at all: not placed (the CPU path says why)
    assert flac_gpu.pack(data[: len(data) // 2]) is None
    assert flac_gpu.pack(b"fLaC but not really") is None
    assert flac_gpu.pack(b"RIFF" + bytes(100)) is None


def test_what_the_gpu_path_leaves_to_the_cpu():
    """32-bit and 12-bit streams, and a stream with no sample count, are left to the CPU path; so is more audio
    than one record may hold, with the CPU path's error."""
    x = signal(np.random.default_rng(4), 8000, 1, "speech")
    data = bytearray(flac_bytes(x, "PCM_16"))
    assert flac_gpu.pack(bytes(data)) is not None
    # STREAMINFO's total samples set to 0 ("unknown")
    info = 8  # (after "fLaC" and the block header)
    data[info + 13] &= 0xF0
    data[info + 14: info + 18] = bytes(4)
    assert flac_gpu.pack(bytes(data)) is None
    with pytest.raises(ValueError, match="sample bound"):
        flac_gpu.pack(flac_bytes(x, "PCM_16"), None, 1000)


def test_the_decoding_processes_share_placed_bytes(tmp_path):
    """Placed FLAC bytes go through shared memory as samples do (``_share``), and come back whole
    (:class:`SharedFiles`), into an array or into a staging slot's bytes."""
    import os

    from gpubatch.engine.gpu.audio_records import SHM_DIR, Shared, SharedFiles, _share

    if not os.path.isdir(SHM_DIR):
        pytest.skip("no /dev/shm")
    blobs = [flac_bytes(signal(np.random.default_rng(i), 160000, 1, "noise"), "PCM_16") for i in range(3)]
    packed = [flac_gpu.pack(b) for b in blobs]
    got = _share([([("job", d) for d in packed], {})])
    placed = [o[1] for o in got[0][0]]
    assert all(isinstance(d.samples.data, Shared) for d in placed)
    files = SharedFiles()
    files.taken(got)
    back = [files.read(placed[0])]
    slot = np.zeros(placed[1].samples.nbytes + placed[2].samples.nbytes, np.uint8)
    back.append(files.read_into(placed[1], slot[: placed[1].samples.nbytes]))
    back.append(files.read_into(placed[2], slot[placed[1].samples.nbytes:]))
    files.close()
    for b, d in zip(blobs, back):
        assert bytes(np.asarray(d.samples.data)) == b
        assert np.array_equal(flac_gpu.decode_host(d).samples, reference(b))


# --- on the GPU (make gpu-test) ------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_gpu_decodes_a_ragged_batch_as_libsndfile(tmp_path):
    """A batch of streams of every depth, channel count and length, with a damaged one and one cut to its first
    second, decoded in one launch: each libsndfile's samples, the damaged one decoded on the CPU as the CPU path
    does (or its error)."""
    import cupy as cp

    from gpubatch.engine.gpu.audio_feed import to_device
    from gpubatch.errors import RecordError

    rng = np.random.default_rng(5)
    blobs, seconds = [], []
    for subtype in ("PCM_16", "PCM_24", "PCM_S8"):
        for channels in (1, 2):
            for n in (3000, 48017, 160000):
                blobs.append(flac_bytes(signal(rng, n, channels, ("speech", "noise", "wasted")[n % 3]), subtype, 0.5))
                seconds.append(None)
    blobs.append(blobs[-1])
    seconds.append(1.0)
    damaged = bytearray(blobs[4])
    damaged[len(damaged) // 2] ^= 0x10
    blobs.append(bytes(damaged))
    seconds.append(None)
    items = [flac_gpu.pack(b, s) for b, s in zip(blobs, seconds)]
    got = to_device(items)
    buf = cp.asarray(np.frombuffer(b"".join(blobs) + bytes(flac_gpu.PAD), np.uint8))
    offs = np.cumsum([0] + [len(b) for b in blobs])
    refused: list[int] = []
    flac_gpu.decode_on_gpu(buf, [(int(o), d) for o, d in zip(offs, items)], None, refused)
    assert refused == [len(items) - 1]  # (decoded on the GPU, every one but the damaged one)
    cp.cuda.Device().synchronize()
    for b, s, g in zip(blobs[:-1], seconds, got):
        ref = reference(b)
        if s is not None:
            ref = ref[:, : int(np.ceil(s * 16000))]
        assert not isinstance(g, RecordError) and np.array_equal(cp.asnumpy(g.samples), ref)
    try:
        want = flac_gpu.decode_host(items[-1]).samples
    except ValueError:
        assert isinstance(got[-1], RecordError)
    else:
        assert np.array_equal(cp.asnumpy(got[-1].samples), want)


@pytest.mark.gpu
def test_convert_writes_the_same_bytes_with_flac_decoded_on_the_gpu(tmp_path, monkeypatch):
    """``convert`` of FLAC clips to log-mel features on the GPU: the dataset its FLAC decoder writes is the one the
    CPU's decoding (``GPUBATCH_FLAC_GPU=0``) writes, byte for byte (each clip's first second: its frames up to it), a
    corrupt clip skipped."""
    from gpubatch.api import convert

    src = tmp_path / "src"
    rng = np.random.default_rng(6)
    for i in range(24):
        write(src / f"clip_{i:02d}.flac", signal(rng, 16000 + 997 * i, 1 + i % 2, "speech").astype(np.float32), 16000)
    cut = (src / "clip_03.flac").read_bytes()
    (src / "clip_99.flac").write_bytes(cut[: len(cut) // 2])  # (cut short: the CPU path's error, skipped)
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("GPUBATCH_FLAC_GPU", flag)
        dst = tmp_path / f"out{flag}"
        s = convert(src, dst, to="webdataset", sample_rate=16000, mono=True, duration=1.0,
                    features="log-mel(n_mels=80)", device="gpu", shard_size=10)
        assert s.records_out == 24 and [r["key"] for r in s.skipped] == ["clip_99"]
        assert "cut short" in s.skipped[0]["reason"]
        outs[flag] = {p.name: p.read_bytes() for p in sorted(dst.glob("*.tar"))}
    assert outs["1"] == outs["0"]



def test_the_pipelines_decoding_processes_place_flac_in_their_slabs(tmp_path):
    """``AudioPipeline``'s feed with the GPU's FLAC decoder (``packed``): a FLAC file's bytes read into the slab, its
    frames found, at 64-byte steps beside the samples of the files libsndfile decodes there (a WAV file), a file too
    large for the slab in bytes of its own; decoded, each is libsndfile's."""
    import os

    from gpubatch.engine.gpu.audio_feed import DecodeWorkers, SharedFeed

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    rng = np.random.default_rng(7)
    paths = []
    for i, n in enumerate((16000, 3001, 40000)):
        paths.append(write(tmp_path / f"c{i}.flac", signal(rng, n, 1 + i % 2, "speech").astype(np.float32), 16000))
    paths.append(write(tmp_path / "w.wav", signal(rng, 8000, 1, "speech").astype(np.float32), 16000))
    paths.append(write(tmp_path / "big.flac", signal(rng, 400000, 2, "noise").astype(np.float32), 16000))
    workers = DecodeWorkers(1)
    try:
        feed = SharedFeed(workers, 2, 8, slab_bytes=1 << 20, packed=True)
        try:
            got = list(feed.items(((str(p), p.stem) for p in paths), None))
            kinds = [(type(d.samples).__name__, where is not None) for _, d, where in got]
            decoded = [flac_gpu.decode_host(d).samples if flac_gpu.is_packed(d) else np.array(d.samples)
                       for _, d, _ in got]
            offsets = [where[1] for _, d, where in got if where is not None and flac_gpu.is_packed(d)]
        finally:
            feed.close()
    finally:
        workers.close()
    assert kinds == [("FlacPacked", True)] * 3 + [("ndarray", True), ("FlacPacked", False)]
    # what a worker sends back for bytes in the slab: their place and length, not the bytes (pickled through the pipe)
    from gpubatch.engine.gpu.audio_feed import _place_flac

    placed = _place_flac(str(paths[0]), "c0", np.zeros(1 << 18, np.float32), 32, None, 0)
    assert placed[:3] == ("c0", "flac", 32) and placed[4] == paths[0].stat().st_size and placed[5].samples.data is None
    assert all(o % 16 == 0 for o in offsets)  # (in float32 words: 64-byte steps)
    for p, x in zip(paths, decoded):
        assert np.array_equal(x, reference(p.read_bytes())), p.name


def test_a_record_a_chain_would_stream_is_left_to_the_cpu(monkeypatch):
    """A record long enough that a chain with no leading duration streams it (``should_stream``: read a block at a
    time on the CPU) is not placed for the GPU; with a leading duration it is, its first seconds only."""
    from gpubatch.engine.codecs import audio_stream
    from gpubatch.engine.spec import parse_chain

    monkeypatch.setattr(audio_stream, "STREAM_SAMPLES", 10_000)
    data = flac_bytes(signal(np.random.default_rng(8), 48000, 1, "speech"), "PCM_16")
    ops = parse_chain("log_mel(n_mels=40)")
    assert flac_gpu.pack(data, None, 0, ops=ops) is None
    assert flac_gpu.pack(data, None, 0) is not None
    assert flac_gpu.pack(data, 1.0, 0, ops=parse_chain("fix_duration(seconds=1) | log_mel(n_mels=40)")) is not None


@pytest.mark.gpu
def test_audio_pipeline_with_flac_decoded_on_the_gpu_gives_the_same_batches(tmp_path):
    """``AudioPipeline(flac_gpu=True)``: FLAC read into its slabs as bytes and decoded on the GPU, beside a WAV file
    libsndfile decodes there: the same batches as the pipeline's decoding on the CPU."""
    import cupy as cp

    from gpubatch.engine.spec import parse_chain
    from gpubatch.pipelines.audio import AudioPipeline

    rng = np.random.default_rng(9)
    files = [write(tmp_path / f"c{i}.flac", signal(rng, 12000 + 1500 * i, 1 + i % 2, "speech").astype(np.float32),
                   16000) for i in range(10)]
    files.append(write(tmp_path / "w.wav", signal(rng, 9000, 1, "speech").astype(np.float32), 16000))
    ops = parse_chain("mono() | fix_duration(seconds=1) | log_mel(n_mels=40)")
    got = {}
    for flag in (True, False):
        with AudioPipeline(ops, device="gpu", workers=2, flac_gpu=flag) as pipe:
            got[flag] = []
            for b in pipe.iterate_files(files, 4):
                b.synchronize()
                got[flag].append((b.keys, cp.asnumpy(b.data)))
    assert [k for k, _ in got[True]] == [k for k, _ in got[False]]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got[True], got[False]))


def test_the_pipeline_takes_the_gpu_s_flac_decoder_as_convert_does(monkeypatch):
    """``AudioPipeline(flac_gpu=None)``, its default, follows ``GPUBATCH_FLAC_GPU`` (on unless 0), as ``convert``'s
    GPU audio unit does; a ``flac_gpu`` given is kept."""
    from gpubatch.engine.spec import parse_chain
    from gpubatch.pipelines.audio import AudioPipeline

    ops = parse_chain("log_mel(n_mels=40)")
    monkeypatch.delenv("GPUBATCH_FLAC_GPU", raising=False)
    assert AudioPipeline(ops, device="cpu").flac_gpu is True
    assert AudioPipeline(ops, device="cpu", flac_gpu=False).flac_gpu is False
    monkeypatch.setenv("GPUBATCH_FLAC_GPU", "0")
    assert AudioPipeline(ops, device="cpu").flac_gpu is False
    assert AudioPipeline(ops, device="cpu", flac_gpu=True).flac_gpu is True
