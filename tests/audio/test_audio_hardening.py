"""Audio inputs that lost or mismatched data without a word: NeMo segments, truncated files, hostile
manifest lines, and the memory a long record takes."""

from __future__ import annotations

import io
import json
import math
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf

from gpubatch.api import augment, convert, info, open_dataset
from tests.audio.sounds import tone, write
from tests.helpers import run_cli

RATE = 16000


def _stepped(rate: int = RATE) -> np.ndarray:
    """3 s mono whose second k holds a tone of (k + 1) * 300 Hz: a cut in the wrong place shows."""
    return np.concatenate([tone(1.0, rate, 300.0 * (k + 1)) for k in range(3)])


def _nemo(root, lines: list, fmt: str = "wav", subtype: str | None = None):
    root.mkdir(parents=True, exist_ok=True)
    write(root / f"talk.{fmt}", _stepped(), RATE, fmt, subtype)
    (root / "manifest.json").write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return root


SEGMENTS = [{"audio_filepath": "talk.{fmt}", "offset": k, "duration": 1.0, "text": f"part {k}"} for k in range(3)]


@pytest.mark.parametrize("fmt,subtype", [("wav", "PCM_16"), ("wav", "PCM_24"), ("flac", "PCM_16"), ("flac", "PCM_24")])
def test_nemo_segments_pass_through_as_their_own_exact_samples(tmp_path, fmt, subtype):
    src = _nemo(tmp_path / "src", [{**d, "audio_filepath": d["audio_filepath"].format(fmt=fmt)} for d in SEGMENTS],
                fmt, subtype)
    whole, _ = sf.read(src / f"talk.{fmt}", dtype="int32")
    s = convert(src, tmp_path / "wds", to="webdataset")
    assert s.records_out == 3 and not s.skipped
    with open_dataset(tmp_path / "wds") as r:
        recs = sorted(r, key=lambda x: x.meta["segment"]["offset"])
    for k, rec in enumerate(recs):
        x, rate = sf.read(__import__("io").BytesIO(rec.data), dtype="int32")
        assert rate == RATE and rec.meta["text"] == f"part {k}"
        assert np.array_equal(x, whole[k * RATE : (k + 1) * RATE])  # the segment's samples, exactly
        assert rec.meta["segment"] == {"offset": k, "duration": 1.0} and rec.codec == fmt


def test_nemo_segments_are_cut_before_decoding_and_features(tmp_path):
    src = _nemo(tmp_path / "src", [{**d, "audio_filepath": "talk.flac"} for d in SEGMENTS], "flac")
    s = convert(src, tmp_path / "out", to="audio", sample_rate=8000)
    assert s.records_out == 3
    with open_dataset(tmp_path / "out") as r:
        for rec in r:
            x, rate = sf.read(__import__("io").BytesIO(rec.data))
            assert rate == 8000 and abs(len(x) - 8000) <= 1
            k = int(rec.meta.get("text", "part 9")[-1]) if "text" in rec.meta else None
            spectrum = np.abs(np.fft.rfft(x))
            assert k is None or abs(np.argmax(spectrum) * 8000 / len(x) - 300 * (k + 1)) < 10


def test_a_whole_recording_line_still_passes_through_untouched(tmp_path):
    src = _nemo(tmp_path / "src", [{"audio_filepath": "talk.wav", "duration": 3.0, "text": "all"}])
    convert(src, tmp_path / "wds", to="webdataset")
    with open_dataset(tmp_path / "wds") as r:
        (rec,) = list(r)
    assert rec.data == (src / "talk.wav").read_bytes()


@pytest.mark.parametrize("line,why", [
    ({"audio_filepath": "talk.wav", "offset": float("nan"), "duration": 1.0}, "not a finite number"),
    ({"audio_filepath": "talk.wav", "offset": 5.0, "duration": 1.0}, "outside the recording"),
    ({"audio_filepath": "talk.wav", "offset": 2.5, "duration": 1.0}, "past the recording's end"),
    ({"audio_filepath": "talk.wav", "offset": -1, "duration": 1.0}, "a segment of offset"),
    ('{"audio_filepath": "talk.wav", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
], ids=["nan-offset", "offset-outside", "past-the-end", "negative-offset", "deeply-nested"])
def test_a_bad_segment_or_line_is_that_records_error_and_no_nan_reaches_json(tmp_path, line, why):
    src = _nemo(tmp_path / "src", [line, {"audio_filepath": "talk.wav", "offset": 0, "duration": 1.0, "text": "ok"}])
    p = run_cli("convert", src, tmp_path / "out", "--to", "webdataset", "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    summary = json.loads(p.stdout)
    assert summary["records_out"] == 1 and len(summary["skipped"]) == 1
    assert why in summary["skipped"][0]["reason"]
    manifest = (tmp_path / "out" / "gpubatch.json").read_text()
    json.loads(manifest, parse_constant=lambda c: pytest.fail(f"{c} in the manifest"))
    for tar in (tmp_path / "out").glob("*.tar"):
        assert b"NaN" not in tar.read_bytes()
    rep = info(src)
    assert rep.records == 1 and len(rep.unreadable) == 1
    assert not math.isnan(rep.audio.get("hours", 0) or 0)


def _flac_frames(data: bytes) -> list[int]:
    """Where each frame of a FLAC file begins (its headers, found and checked by the reader's parser)."""
    from gpubatch.engine.codecs.audio_end import _flac_frame_header

    fixed = int.from_bytes(data[18:20], "big")
    return [p for p in range(42, len(data) - 6) if data[p] == 0xFF and _flac_frame_header(data, p, fixed)]


@pytest.mark.parametrize("cut", ["wav-half", "flac-60%", "flac-frame-boundary", "flac-one-byte"])
@pytest.mark.parametrize("mode", ["pass-through", "decode", "info"])
def test_a_truncated_audio_file_is_listed_not_written_as_whole(tmp_path, cut, mode):
    from tests.audio.sounds import encoded

    src = tmp_path / "src"
    src.mkdir()
    x = tone(2.0, RATE)
    fmt = cut.split("-")[0]
    data = encoded(x, RATE, fmt)
    if cut == "wav-half":
        data = data[: 44 + RATE * 2]  # 1 s of the 2 s the header promises
    elif cut == "flac-60%":
        data = data[: int(len(data) * 0.6)]
    elif cut == "flac-frame-boundary":
        data = data[: _flac_frames(data)[-2]]  # cut between two frames: what remains is whole frames
    else:
        data = data[:-1]
    (src / f"bad.{fmt}").write_bytes(data)
    write(src / f"good.{fmt}", tone(1.0, RATE), RATE)
    if mode == "info":
        rep = info(src)
        assert rep.records == 1 and len(rep.unreadable) == 1 and "cut short" in rep.unreadable[0]["reason"]
        return
    opts = {} if mode == "pass-through" else {"sample_rate": 8000}
    s = convert(src, tmp_path / "out", to="webdataset", **opts)
    assert s.records_out == 1 and len(s.skipped) == 1
    assert s.skipped[0]["key"] == "bad" and "cut short" in s.skipped[0]["reason"]


def test_whole_files_of_every_kind_pass_the_length_check(tmp_path):
    from gpubatch.engine.codecs.audio_io import probe_audio
    from tests.audio.sounds import encoded

    for fmt, sub in [("wav", "PCM_16"), ("wav", "PCM_24"), ("wav", "FLOAT"), ("flac", "PCM_16"), ("flac", "PCM_24"),
                     ("flac", "PCM_S8"), ("ogg", None), ("mp3", None), ("au", None), ("caf", None), ("w64", None)]:
        for seconds, ch in [(0.01, 1), (1.3, 2), (7.0, 1)]:
            data = encoded(tone(seconds, 44100, channels=ch), 44100, fmt, sub)
            probe_audio(data)  # raises where the check is wrong
            (tmp_path / f"x.{fmt}").write_bytes(data)
            probe_audio(tmp_path / f"x.{fmt}")


def test_verify_full_decodes_every_passed_through_audio_file(tmp_path):
    from tests.audio.sounds import encoded

    src = tmp_path / "src"
    src.mkdir()
    data = bytearray(encoded(tone(2.0, RATE), RATE, "flac"))
    frames = _flac_frames(bytes(data))
    data[frames[3] + 20] ^= 0xFF  # a damaged frame mid-file; the file's end is whole
    (src / "bad.flac").write_bytes(bytes(data))
    write(src / "good.flac", tone(1.0, RATE), RATE)
    assert convert(src, tmp_path / "a", to="webdataset").records_out == 2  # headers: the end is whole
    s = convert(src, tmp_path / "b", to="webdataset", verify="full")
    assert s.records_out == 1 and s.skipped[0]["key"] == "bad"


@pytest.mark.parametrize("opts", [{"audio_format": "npy", "sample_rate": 8000},
                                  {"features": "log-mel(n_mels=40)", "sample_rate": 16000, "duration": 1.0},
                                  {"audio_format": "wav", "mono": True}, {}])
@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "lmdb", "audio"])
def test_every_audio_output_reads_back(tmp_path, to, opts):
    from tests.audio.sounds import speech_commands

    src = speech_commands(tmp_path / "src")
    try:
        s = convert(src, tmp_path / "out", to=to, **opts)
    except Exception as e:  # a format that does not hold this output says so before writing
        assert "holds" in str(e) or "cannot hold" in str(e), e
        return
    assert s.records_out == 6 and not s.skipped
    again = convert(tmp_path / "out", tmp_path / "again", to="webdataset")
    assert again.records_out == 6 and not again.skipped, again.skipped[:3]
    rep = info(tmp_path / "out")
    assert rep.records == 6 and not rep.unreadable, rep.unreadable[:3]
    if opts.get("audio_format") == "npy":  # a waveform array decodes as audio again
        s2 = convert(tmp_path / "out", tmp_path / "resampled", to="webdataset", sample_rate=4000, audio_format="npy")
        assert s2.records_out == 6 and not s2.skipped, s2.skipped[:2]
        with open_dataset(tmp_path / "resampled") as r:
            for rec in r:
                x = np.load(__import__("io").BytesIO(rec.data))
                assert rec.meta["sample_rate"] == 4000 and abs(x.shape[-1] - round(0.5 * 4000)) <= 0.25 * 4000


@pytest.mark.parametrize("opts", [{"audio_format": "npy"}, {"audio_format": "npy", "sample_rate": 24000}])
def test_a_long_record_takes_at_most_twice_its_output_in_memory(tmp_path, opts):
    """A 10-minute 48 kHz stereo WAV (110 MiB) to a float32 .npy (220 MiB, 110 at 24 kHz): the process's
    peak, less what it holds before any record, stays within twice the output."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    rate, n = 48000, 48000 * 600
    x = (np.random.default_rng(0).standard_normal((n, 2)) * 0.1).astype(np.float32)
    sf.write(src / "long.wav", x, rate, subtype="PCM_16")
    del x
    args = ", ".join(f"{k}={v!r}" for k, v in opts.items())
    code = ("import resource, sys; from gpubatch.api import convert; import gpubatch.formats.webdataset, soundfile, soxr; "
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"convert(sys.argv[1], sys.argv[2], to='webdataset', {args}); "
            "print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    p = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "out")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    base, peak = (int(v) << 10 for v in p.stdout.split())
    out = sum(f.stat().st_size for f in (tmp_path / "out").glob("*.tar"))
    assert peak - base <= 2 * out, (peak - base) / out


@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "lmdb"])
def test_spec_augment_masks_computed_log_mel_features(tmp_path, to):
    from tests.audio.sounds import speech_commands

    src = speech_commands(tmp_path / "src")
    convert(src, tmp_path / "mel", to=to, features="log-mel(n_mels=40)", sample_rate=16000, duration=1.0)
    s = augment(tmp_path / "mel", tmp_path / "aug", ops="freq_mask(width=8, count=2) | time_mask(width=20)",
                copies=2, seed=3)
    assert s.records_out == 12 and not s.skipped
    with open_dataset(tmp_path / "mel") as r:
        before = {rec.key: np.load(__import__("io").BytesIO(rec.data)) for rec in r}
    with open_dataset(tmp_path / "aug") as r:
        for rec in r:
            x = np.load(__import__("io").BytesIO(rec.data))
            ref = before[rec.key.rsplit("_aug", 1)[0]]
            assert x.shape == ref.shape == (40, 100) and x.dtype == np.float16
            assert (x != ref).any() and (x == ref).mean() > 0.3  # masked bands and frames, the rest kept
    again = augment(tmp_path / "mel", tmp_path / "aug2", ops="freq_mask(width=8, count=2) | time_mask(width=20)",
                    copies=2, seed=3)
    assert again.records_out == 12


def test_clips_a_found_manifest_leaves_out_are_said_and_a_manifest_file_is_a_source(tmp_path):
    """A manifest found in the folder is the dataset: the clips beside it that it does not name are said
    (a warning of ``info`` and ``convert``, and ``info``'s ``left_out``), never left out without a word;
    the manifest itself, under any name, is a source that reads its lines alone."""
    src = _nemo(tmp_path / "src", [{"audio_filepath": "talk.wav", "duration": 3.0, "text": "all"}])
    write(src / "other.wav", _stepped(), RATE, "wav")
    write(src / "sub" / "more.flac", _stepped(), RATE, "flac")
    said = f"2 audio files under {src} are not in manifest.json and left out (other.wav, sub/more.flac)"
    report = info(src)
    assert any(w.startswith(said) for w in report.warnings), report.warnings
    assert report.left_out == {"unlisted": {"count": 2, "names": ["other.wav", "sub/more.flac"]}}
    s = convert(src, tmp_path / "wds", to="webdataset")
    assert s.records_out == 1 and any(w.startswith(said) for w in s.warnings), s.warnings
    (src / "manifest.json").rename(src / "train_manifest.json")  # NeMo's usual name, given as the source
    s = convert(src / "train_manifest.json", tmp_path / "alone", to="webdataset")
    assert s.records_out == 1 and not any("left out" in w for w in s.warnings), s.warnings
    with open_dataset(tmp_path / "alone") as r:
        assert [rec.meta["text"] for rec in r] == ["all"]
    p = run_cli("info", src / "train_manifest.json", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["format"] == "audio", p.stderr


def test_one_recording_is_a_dataset_of_one_record(tmp_path):
    """One audio file given alone is the source (a FLAC was read as a CSV, and a WebM's sound needs --from audio,
    as a folder of WebM files does)."""
    write(tmp_path / "talk.flac", tone(0.5), RATE, "flac")
    assert info(tmp_path / "talk.flac").records == 1
    s = convert(tmp_path / "talk.flac", tmp_path / "wav", to="audio", audio_format="wav")
    assert s.records_out == 1 and [p.name for p in (tmp_path / "wav").rglob("*.wav")] == ["talk.wav"]
    p = run_cli("info", tmp_path / "talk.flac", "--from", "audio", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["records"] == 1, p.stderr


def test_speech_commands_tar_reads_with_from_audio_as_its_extracted_folders(tmp_path):
    """Speech Commands ships as a tar.gz of word folders (``yes/<clip>.wav``, ``_background_noise_/``, the split
    lists): read as shards, its samples carry no label, and a warning names --from audio, which reads it as the
    audio folder its extraction makes (``_background_noise_`` left out and said, as the folder reader does)."""
    import tarfile

    root = tmp_path / "sc"
    for word, hz in (("yes", 440.0), ("no", 660.0), ("_background_noise_", 100.0)):
        write(root / word / "0a7c2a8d_nohash_0.wav", tone(0.25, hz), RATE, "wav")
    (root / "testing_list.txt").write_text("yes/0a7c2a8d_nohash_0.wav\n")
    src = tmp_path / "speech_commands_v0.02.tar.gz"
    with tarfile.open(src, "w:gz") as t:
        t.add(root, ".")
    s = convert(src, tmp_path / "shards", to="webdataset")
    assert any(w.startswith(f"the samples of {src} carry no label and their recordings lie in 2 folders under the "
                            "tar's root (no/, yes/)") and w.endswith("pass --from audio") for w in s.warnings), s.warnings
    s = convert(src, tmp_path / "words", to="audio", from_format="audio")
    assert s.records_out == 2 and not s.skipped
    assert (f"left out of {src}, as no records: 1 audio file outside the class folders or in a folder named _... "
            "(./_background_noise_/0a7c2a8d_nohash_0.wav); 1 file that is no audio (./testing_list.txt)") in s.warnings
    assert info(tmp_path / "words").classes == ["no", "yes"]
    with open_dataset(src, "audio") as r:
        assert sorted((rec.key, rec.label) for rec in r) == [("no/0a7c2a8d_nohash_0", 0), ("yes/0a7c2a8d_nohash_0", 1)]
    # LibriSpeech's tar: its transcripts give its records' text once extracted, so it is not read as speaker folders
    (root / "yes" / "0a7c2a8d.trans.txt").write_text("0a7c2a8d_nohash_0 YES\n")
    with tarfile.open(tmp_path / "libri.tar.gz", "w:gz") as t:
        t.add(root, ".")
    p = run_cli("info", tmp_path / "libri.tar.gz", "--from", "audio")
    assert p.returncode != 0 and p.stderr.strip() == (
        f"error: {tmp_path / 'libri.tar.gz'} holds ./yes/0a7c2a8d.trans.txt, which gives its records or labels once "
        "extracted: unpack it and pass the folder"), p.stderr


def test_an_aiff_recording_is_a_record_and_other_files_are_said(tmp_path):
    """AIFF (libsndfile reads it) is a recording like WAV; a file that is no recording (notes, a codec gpubatch
    does not read) is said, not left out without a word; LibriSpeech's transcripts are read, not said."""
    root = tmp_path / "src"
    write(root / "yes" / "a.wav", tone(0.5), RATE, "wav")
    (root / "no").mkdir()
    sf.write(root / "no" / "b.aiff", tone(0.5), RATE, format="AIFF")
    (root / "no" / "notes.txt").write_text("recorded in a quiet room")
    (root / "no" / "c.ape").write_bytes(b"MAC " + b"\0" * 60)  # (Monkey's Audio: no codec gpubatch reads)
    (root / "yes" / "._a.wav").write_bytes(b"\0\5\x16\7\0\2\0\0Mac OS X        ")  # (macOS's AppleDouble)
    s = convert(root, tmp_path / "wds", to="webdataset")
    assert s.records_out == 2 and not s.skipped, s.skipped
    said = (f"left out of {root}, as no records: 2 files that are no audio (no/c.ape, no/notes.txt); 1 hidden file "
            "or folder (yes/._a.wav)")
    assert said in s.warnings, s.warnings
    assert info(root).left_out == {"other": {"count": 2, "names": ["no/c.ape", "no/notes.txt"]},
                                   "hidden": {"count": 1, "names": ["yes/._a.wav"]}}
    with open_dataset(tmp_path / "wds") as r:
        recs = {rec.key: rec for rec in r}
    assert recs["no/b"].codec == "aiff" and recs["no/b"].data == (root / "no" / "b.aiff").read_bytes()
    libri = tmp_path / "libri" / "19" / "198"
    write(libri / "19-198-0001.flac", tone(0.5), RATE, "flac")
    (libri / "19-198.trans.txt").write_text("19-198-0001 NORTHANGER ABBEY\n")
    s = convert(tmp_path / "libri", tmp_path / "libri-wds", to="webdataset")
    assert s.records_out == 1 and not any("left out" in w for w in s.warnings), s.warnings


def _sound_in(path, fmt: str, codec: str, rate: int = 48000) -> None:
    """One second of a tone in a container PyAV writes (WebM/Opus, as yt-dlp downloads sound; Matroska audio)."""
    av = pytest.importorskip("av")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate)
        s.layout = "mono"
        frame = av.AudioFrame.from_ndarray(tone(1.0, rate, 440.0).astype(np.float32).reshape(1, -1), format="flt",
                                           layout="mono")
        frame.sample_rate = rate
        for p in [*s.encode(frame), *s.encode()]:
            c.mux(p)


def test_sound_in_webm_and_matroska_is_a_recording(tmp_path):
    """yt-dlp's sound comes as WebM (Opus): beside other recordings, a folder of them is audio, every file a
    record, written as ``.weba`` so that it reads back as sound; a folder of WebM alone looks like video, and
    ``--from audio`` reads it as sound instead of refusing."""
    from gpubatch.engine.codecs.audio_io import sniff_audio

    src = tmp_path / "src"
    _sound_in(src / "dog" / "a.webm", "webm", "libopus")
    _sound_in(src / "dog" / "b.mka", "matroska", "libopus")
    write(src / "cat" / "c.flac", tone(1.0, RATE, 300.0), RATE, "flac")
    assert sniff_audio((src / "dog" / "a.webm").read_bytes()) == "weba"
    assert sniff_audio((src / "dog" / "b.mka").read_bytes()) == "mka"
    assert info(src).format == "audio" and info(src).records == 3
    s = convert(src, tmp_path / "wds", to="webdataset")
    assert s.passthrough == 3 and not s.skipped and not s.warnings, (s.skipped, s.warnings)
    with open_dataset(tmp_path / "wds") as r:
        got = {rec.key: rec for rec in r}
    assert got["dog/a"].data == (src / "dog" / "a.webm").read_bytes() and got["dog/a"].codec == "weba"
    assert got["dog/b"].data == (src / "dog" / "b.mka").read_bytes() and got["dog/b"].codec == "mka"
    assert {r.media.value for r in got.values()} == {"audio"}
    convert(src, tmp_path / "lmdb", to="lmdb")  # (an LMDB's values are told apart by their bytes alone)
    with open_dataset(tmp_path / "lmdb") as r:  # (closed: its environment is shared by the process's readers)
        assert sorted((rec.key, rec.codec, rec.media.value) for rec in r) == [
            ("cat/c", "flac", "audio"), ("dog/a", "weba", "audio"), ("dog/b", "mka", "audio")]
    s = convert(tmp_path / "wds", tmp_path / "again", to="audio")  # (and back to a folder of recordings)
    assert s.passthrough == 3 and (tmp_path / "again" / "dog" / "a.weba").read_bytes() == (
        src / "dog" / "a.webm").read_bytes()
    s = convert(tmp_path / "again", tmp_path / "mel3", to="webdataset", sample_rate=16000,
                features="log-mel(n_mels=40)")
    assert s.records_out == 3 and not s.skipped, s.skipped
    alone = tmp_path / "alone"
    _sound_in(alone / "x" / "a.webm", "webm", "libopus")
    assert info(alone).format == "video"  # (WebM alone: clips, unless told)
    s = convert(alone, tmp_path / "mel", from_format="audio", to="webdataset", sample_rate=16000,
                features="log-mel(n_mels=40)")
    assert s.records_out == 1 and not s.skipped, s.skipped
    p = run_cli("info", alone)
    assert "no video stream (1 audio stream: a folder of such files is read as sound with --from audio)" in " ".join(
        (p.stdout + p.stderr).split()), p.stdout + p.stderr


def test_a_tar_read_with_from_audio_cut_before_its_first_whole_clip_is_read_as_audio(tmp_path):
    """Its media is what --from names, whatever is left of it: cut inside its first clip, the run's line names the
    damage, where it had said "resample takes audio data, not image" (the tar's media told from members whole)."""
    import tarfile

    root = tmp_path / "sc"
    for word in ("yes", "no"):
        write(root / word / "a.wav", tone(0.5), RATE, "wav")
    src = tmp_path / "words.tar"
    with tarfile.open(src, "w") as t:
        t.add(root / "yes", "yes")
        t.add(root / "no", "no")
    src.write_bytes(src.read_bytes()[:3000])  # (inside yes/a.wav)
    p = run_cli("convert", src, tmp_path / "out", "--to", "webdataset", "--from", "audio", "--sample-rate", "8000")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "damaged shard" in line and "audio data, not image" not in line, line


@pytest.mark.parametrize("container,codec", [("webm", "libopus"), ("matroska", "libopus")])
def test_sound_in_matroska_cut_short_is_listed_not_written_or_decoded_as_whole(tmp_path, container, codec):
    """Its Segment's size runs past the file's end: before, 40% of the sound was lost in silence, the file passed
    through as whole and its features made of what was left."""
    src = tmp_path / "src"
    clip = src / "dog" / f"a.{'webm' if container == 'webm' else 'mka'}"
    _sound_in(clip, container, codec)
    write(src / "cat" / "c.flac", tone(1.0, RATE, 300.0), RATE, "flac")
    data = clip.read_bytes()
    clip.write_bytes(data[: int(len(data) * 0.6)])
    for opts in ({}, {"sample_rate": 16000, "features": "log-mel(n_mels=40)"}):
        s = convert(src, tmp_path / f"o{len(opts)}", to="webdataset", from_format="audio", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["dog/a"], s.as_dict()
        assert s.skipped[0]["reason"] == (f"its Matroska header promises {len(data):,} bytes, the file holds "
                                          f"{int(len(data) * 0.6):,}: it is cut short"), s.skipped


def test_an_mp3_cut_short_is_listed_in_pass_through_as_when_decoded(tmp_path):
    """Its header frame (LAME's Xing/Info) counts its bytes: a pass-through had written the cut file as whole, with no
    word, where a decode already listed it (its samples short of the header's count)."""
    from tests.audio.sounds import encoded

    src = tmp_path / "src"
    data = encoded(tone(2.0, 44100, channels=2), 44100, "mp3")
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.mp3").write_bytes(data[: len(data) * 7 // 10])
    write(src / "a" / "ok.mp3", tone(1.0, RATE), RATE, "mp3")
    for opts in ({}, {"sample_rate": 16000}):
        s = convert(src, tmp_path / f"o{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a/x"], s.as_dict()
        assert "cut short" in s.skipped[0]["reason"], s.skipped
        if not opts:
            assert (f"counts {len(data):,} bytes of frames, the file holds {len(data) * 7 // 10:,}"
                    in s.skipped[0]["reason"]), s.skipped


def test_a_wav_of_a_format_code_no_library_knows_is_that_records_error_not_a_traceback(tmp_path):
    """A flipped bit in its ``fmt `` chunk's format code (PCM's 1 made 0x81): libsndfile refuses it and PyAV finds a
    stream of no codec, where its ``rate`` had raised AttributeError through the run."""
    src = tmp_path / "src"
    write(src / "a" / "ok.wav", tone(0.5), RATE, "wav")
    bad = bytearray(write(src / "a" / "x.wav", tone(0.5), RATE, "wav").read_bytes())
    assert bad[20:22] == b"\x01\x00"
    bad[20] = 0x81
    (src / "a" / "x.wav").write_bytes(bytes(bad))
    for opts in ({}, {"sample_rate": 8000}):
        s = convert(src, tmp_path / f"o{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a/x"], s.as_dict()
        assert "names no codec" in s.skipped[0]["reason"], s.skipped


def test_an_mp3_cut_short_behind_a_long_id3_tag_is_listed(tmp_path):
    """Music's MP3s carry cover art in their ID3v2 tag, often past the first 64 KiB read for the check: the frame that
    counts the bytes is looked for behind the tag, whatever its length (up to 16 MiB)."""
    av = pytest.importorskip("av")
    import io

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as c:
        c.metadata["comment"] = "z" * 200_000  # (a tag of 200 KB, as cover art makes)
        s = c.add_stream("libmp3lame", rate=44100)
        s.layout = "mono"
        x = tone(2.0, 44100)
        for i in range(0, len(x), 1152):
            f = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[i : i + 1152].T), format="fltp", layout="mono")
            f.sample_rate = 44100
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    data = buf.getvalue()
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "whole.mp3").write_bytes(data)
    (src / "a" / "cut.mp3").write_bytes(data[: len(data) - 8000])
    for opts in ({}, {"sample_rate": 8000}):
        s = convert(src, tmp_path / f"o{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a/cut"], s.as_dict()
        assert "bytes of frames" in s.skipped[0]["reason"], s.skipped


def test_an_m4a_cut_short_is_listed_whether_its_index_is_in_front_or_at_its_end(tmp_path):
    """With its index in front (``faststart``, as streaming sites serve it) a cut M4A had passed through as whole, with
    no word, its last packets gone; with its index at its end it said only "not an audio file gpubatch reads"."""
    av = pytest.importorskip("av")

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    write(src / "a" / "ok.wav", tone(0.5), RATE, "wav")
    for name, opts in (("front", {"movflags": "faststart"}), ("end", {})):
        path = tmp_path / f"{name}.m4a"
        with av.open(str(path), "w", format="mp4", options=opts) as c:
            s = c.add_stream("aac", rate=RATE)
            s.layout = "mono"
            x = tone(2.0, RATE)
            for i in range(0, len(x), 1024):
                f = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[i : i + 1024].T), format="fltp", layout="mono")
                f.sample_rate = RATE
                for p in s.encode(f):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        data = path.read_bytes()
        (src / "a" / f"{name}.m4a").write_bytes(data[: len(data) * 3 // 4])
    for opts in ({}, {"sample_rate": 8000}):
        s = convert(src, tmp_path / f"o{len(opts)}", to="webdataset", **opts)
        reasons = {e["key"]: e["reason"] for e in s.skipped}
        assert s.records_out == 1 and sorted(reasons) == ["a/end", "a/front"], s.as_dict()
        assert reasons["a/end"] == "the file is cut short: its index (the moov box, at its end) is not in it whole"
        assert reasons["a/front"].startswith("the file is cut short: its index lists "), reasons


@pytest.mark.parametrize("fmt,sub", [("ogg", "OPUS"), ("ogg", None), ("aac", None), ("wma", None)],
                         ids=["opus", "vorbis", "aac", "wma"])
def test_an_ogg_aac_or_wma_file_cut_short_is_listed_in_pass_through(tmp_path, fmt, sub):
    """Ogg Opus, AAC as a raw stream (ADTS) and WMA cut short had passed through as whole, exit 0 and no word (their
    decoders stop quietly at the cut), and an Ogg Vorbis file cut in its first pages was said to hold "no audio
    samples": the last Ogg page or ADTS frame runs past the file's end, or the file is shorter than the size its ASF
    header gives. Whole files of every length pass. AAC as ADTS is written as .aac (it had been named .mp3)."""
    from gpubatch.engine.codecs.audio_io import probe_audio
    from tests.audio.sounds import encoded

    rate = 48000 if sub == "OPUS" else 16000
    for seconds, ch in [(0.3, 1), (1.3, 2), (7.0, 1)]:
        probe_audio(encoded(tone(seconds, rate, channels=ch), rate, fmt, sub))  # (raises where the check is wrong)
    data = encoded(tone(3.0, rate, channels=2), rate, fmt, sub)
    ext = "opus" if sub == "OPUS" else fmt
    for i, at in enumerate((0.3, 0.55, 0.8)):
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / f"bad.{ext}").write_bytes(data[: int(len(data) * at)])
        (src / f"good.{ext}").write_bytes(data)
        s = convert(src, tmp_path / f"out{i}", to="webdataset", from_format="audio")
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["bad"], s.as_dict()
        assert "cut short" in s.skipped[0]["reason"], s.skipped
        written = next((tmp_path / f"out{i}").glob("*.tar"))
        with tarfile.open(written) as t:  # (AAC as ADTS had been written as .mp3: what libsndfile reads as MP3)
            assert [m.name for m in t.getmembers() if not m.name.endswith(".cls")] == [f"good.{ext}"]


@pytest.mark.parametrize("fmt", ["au", "caf", "w64"])
def test_au_caf_and_w64_recordings_are_records_and_cut_ones_are_listed(tmp_path, fmt):
    """libsndfile reads Sun/NeXT AU (GTZAN's music genres come as .au), Apple's CAF and Sony's Wave64; a folder of them
    had been "left out ... files that are no audio". They pass through as they are (the codec named, the extension
    kept), decode to features, and one cut short is listed (libsndfile reads such a file to its cut without a word):
    its header's sizes tell it."""
    from gpubatch.engine.codecs.audio_io import audio_shortfall, probe_audio, sniff_audio

    kind = {"au": "AU", "caf": "CAF", "w64": "W64"}[fmt]
    root = tmp_path / "src"
    for genre in ("blues", "jazz"):
        (root / genre).mkdir(parents=True)
        for i in range(2):
            sf.write(root / genre / f"{genre}.0000{i}.{fmt}", tone(0.5, RATE, 220.0 * (i + 1)), RATE, format=kind,
                     subtype="PCM_16")
    whole = (root / "jazz" / f"jazz.00001.{fmt}").read_bytes()
    assert sniff_audio(whole) == fmt and probe_audio(whole).codec == fmt
    assert audio_shortfall(whole[:65536], b"", len(whole)) is None
    (root / "jazz" / f"jazz.00001.{fmt}").write_bytes(whole[: len(whole) * 2 // 3])
    s = convert(root, tmp_path / "wds", to="webdataset")
    assert s.records_out == 3 and [e["key"] for e in s.skipped] == ["jazz/jazz.00001"], s.as_dict()
    assert "cut short" in s.skipped[0]["reason"] and not s.warnings, (s.skipped, s.warnings)
    with open_dataset(tmp_path / "wds") as r:
        recs = {rec.key: rec for rec in r}
    assert recs["blues/blues_00000"].codec == fmt and recs["jazz/jazz_00000"].label == 1  # (a key's dots: webdataset's)
    assert recs["blues/blues_00000"].data == (root / "blues" / f"blues.00000.{fmt}").read_bytes()
    with tarfile.open(next((tmp_path / "wds").glob("*.tar"))) as t:
        assert f"blues/blues_00000.{fmt}" in t.getnames()
    s = convert(root, tmp_path / "mel", to="webdataset", sample_rate=8000, features="log-mel(n_mels=80)")
    assert s.records_out == 3 and [e["key"] for e in s.skipped] == ["jazz/jazz.00001"], s.as_dict()
    r = info(root)
    assert r.records == 3 and [u["key"] for u in r.unreadable] == ["jazz/jazz.00001"], r.unreadable
    assert r.audio["codings"] == {f"{fmt} PCM_16": 3}, r.audio


def test_common_voice_tsv_is_read_with_its_sentences(tmp_path):
    """Common Voice keeps its clips in ``clips/`` and their sentences in tab-separated files (``train.tsv``...); such a
    file given as the source had been "cannot tell the format". It is read as the CSV layout is, split at tabs without
    quoting (a sentence that opens with a quote mark keeps the rows after it), its clips found by name under the root;
    the folder itself names its TSV files and takes none."""
    root = tmp_path / "cv-corpus" / "en"
    for i in range(4):
        write(root / "clips" / f"common_voice_en_{i}.wav", tone(0.3, RATE, 200.0 + 50 * i), RATE, "wav")
    head = "client_id\tpath\tsentence_id\tsentence\tup_votes\tdown_votes\tage\tgender\taccents\tlocale\tsegment\n"
    rows = [f"c{i}\tcommon_voice_en_{i}.wav\ts{i}\t{text}\t2\t0\t\t\t\ten\t\n"
            for i, text in enumerate(['"Quoted," she said.', "Plain words.", "It's fine."])]
    (root / "train.tsv").write_text(head + "".join(rows))
    (root / "test.tsv").write_text(head + "c3\tcommon_voice_en_3.wav\ts3\tLast one.\t2\t0\t\t\t\ten\t\n")
    s = convert(root / "train.tsv", tmp_path / "wds", to="webdataset")
    assert s.records_out == 3 and not s.skipped and not s.warnings, s.as_dict()
    with open_dataset(tmp_path / "wds") as r:
        texts = {rec.key: rec.meta.get("text") for rec in r}
    assert texts == {"clips/common_voice_en_0": '"Quoted," she said.', "clips/common_voice_en_1": "Plain words.",
                     "clips/common_voice_en_2": "It's fine."}, texts
    assert info(root / "test.tsv").records == 1
    s = convert(root, tmp_path / "folder", to="webdataset")
    assert any("2 CSV or TSV files in" in w for w in s.warnings), s.warnings


def test_a_format_that_cannot_hold_transcripts_says_it_dropped_them(tmp_path):
    """LMDB's Datum holds no text: LibriSpeech's transcripts converted to it had been dropped with no word. The run now
    says so; the formats that keep them (webdataset, tfrecord, parquet, the audio layout) say nothing and keep them."""
    libri = tmp_path / "libri" / "19" / "198"
    for i in range(2):
        write(libri / f"19-198-000{i}.flac", tone(0.3, RATE, 300.0 + 100 * i), RATE, "flac")
    (libri / "19-198.trans.txt").write_text("19-198-0000 NORTHANGER ABBEY\n19-198-0001 CHAPTER ONE\n")
    s = convert(tmp_path / "libri", tmp_path / "lmdb", to="lmdb")
    assert s.records_out == 2 and any("lmdb cannot hold a record's text" in w for w in s.warnings), s.warnings
    for to in ("webdataset", "tfrecord", "audio"):
        s = convert(tmp_path / "libri", tmp_path / to, to=to)
        assert not any("cannot hold a record's text" in w for w in s.warnings), (to, s.warnings)
        with open_dataset(tmp_path / to) as r:
            assert sorted(rec.meta.get("text") for rec in r) == ["CHAPTER ONE", "NORTHANGER ABBEY"], to


def test_an_utterance_a_librispeech_transcript_names_and_no_recording_holds_is_listed_as_lost(tmp_path):
    """A chapter's ``*.trans.txt`` names each of its utterances; one whose recording is not in the folder (a partial
    extraction, a file deleted) had been left out with no word. It is now listed as lost, with the transcript file that
    names it; a transcript file that cannot be read is said (its recordings are written without their text), and a
    line split by a tab reads as one split by a space."""
    libri = tmp_path / "libri" / "19" / "198"
    for i in range(3):
        write(libri / f"19-198-000{i}.flac", tone(0.2, RATE, 300.0 + 50 * i), RATE, "flac")
    (libri / "19-198.trans.txt").write_text("19-198-0000 A\n19-198-0001\tB C\n19-198-0002 D\n19-198-0003 GONE\n")
    s = convert(tmp_path / "libri", tmp_path / "out", to="webdataset")
    assert s.records_out == 3 and [e["key"] for e in s.skipped] == ["19/198/19-198-0003"], s.as_dict()
    assert "19-198.trans.txt" in s.skipped[0]["reason"] and "no recording" in s.skipped[0]["reason"], s.skipped
    with open_dataset(tmp_path / "out") as r:
        assert {rec.key: rec.meta.get("text") for rec in r} == {"19/198/19-198-0000": "A", "19/198/19-198-0001": "B C",
                                                               "19/198/19-198-0002": "D"}
    other = tmp_path / "libri" / "19" / "199"
    write(other / "19-199-0000.flac", tone(0.2, RATE), RATE, "flac")
    os.mkfifo(other / "19-199.trans.txt")  # (no regular file: not read, never waited on)
    s = convert(tmp_path / "libri", tmp_path / "out2", to="webdataset")
    assert s.records_out == 4 and len(s.skipped) == 1, s.as_dict()
    assert any("19-199.trans.txt" in w and "without their transcripts" in w for w in s.warnings), s.warnings


def _ogg_pages(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of each page of an Ogg file."""
    out, at = [], 0
    while data[at : at + 4] == b"OggS":
        n = data[at + 26]
        size = 27 + n + sum(data[at + 27 : at + 27 + n])
        out.append((at, size))
        at += size
    return out


def _refused_copied_and_decoded(src, tmp_path, key: str, said: str) -> None:
    """``src``'s record ``key`` refused, copied and decoded alike, with ``said`` in its reason; the other converted;
    ``info`` lists it unreadable."""
    for k, opts in enumerate(({}, {"sample_rate": 8000})):
        s = convert(src, tmp_path / f"o{k}", to="webdataset", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == [key], s.as_dict()
        assert said in s.skipped[0]["reason"]
    r = info(src)
    assert r.records == 1 and len(r.unreadable) == 1


@pytest.mark.parametrize("subtype", ["VORBIS", "OPUS"])
def test_an_ogg_file_whose_middle_page_fails_its_checksum_is_damaged_not_shorter(tmp_path, subtype):
    """A byte of a middle Ogg page damaged: libogg passes over the page (its CRC fails) and the pages after it,
    and libsndfile and FFmpeg alike read the samples before it without an error (14,848 of 48,000 in the case
    found); the file had been written as a shorter recording with no word. The last page's granule position tells: the file is its record's error, in a
    copy and in a re-encoding, and ``info`` lists it unreadable."""
    src = tmp_path / "src"
    src.mkdir()
    rate = 16000 if subtype == "VORBIS" else 48000
    x = tone(3.0, rate) + 0.05 * np.random.default_rng(0).standard_normal((3 * rate, 1)).astype(np.float32)
    sf.write(src / "whole.ogg", x, rate, format="OGG", subtype=subtype)
    data = bytearray((src / "whole.ogg").read_bytes())
    pages = _ogg_pages(bytes(data))
    assert len(pages) >= 4
    at, size = pages[2]
    data[at + size // 2] ^= 0x5A
    (src / "damaged.ogg").write_bytes(bytes(data))
    _refused_copied_and_decoded(src, tmp_path, "damaged", "its last Ogg page ends at sample")


def test_an_m4a_whose_decoder_passes_over_damaged_frames_is_damaged_not_shorter(tmp_path):
    """AAC in MP4, read through PyAV: bytes of its frames damaged, FFmpeg's decoder gave 2,048 of 49,024 samples
    (or stopped with an error after some) and the recording was written that much shorter with no word. Fewer
    samples than the track's duration counts are now the record's error."""
    pytest.importorskip("av")
    src = tmp_path / "src"
    x = tone(3.0, 16000) + 0.05 * np.random.default_rng(1).standard_normal((48000, 1)).astype(np.float32)
    data = bytearray(write(src / "whole.m4a", x, 16000).read_bytes())
    mdat = data.index(b"mdat") + 4
    for k in range(64):  # (a damaged stretch in the middle of the samples)
        data[mdat + len(data) // 3 + k] ^= 0xA5
    (src / "damaged.m4a").write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="webdataset", sample_rate=8000)
    if s.skipped:
        assert [e["key"] for e in s.skipped] == ["damaged"] and "damaged or cut short" in s.skipped[0]["reason"]
    else:  # (the decoder concealed the stretch: every sample there, none lost)
        import io

        got = {r.key: sf.info(io.BytesIO(r.data)).frames for r in open_dataset(tmp_path / "out")}
        assert len(got) == 2 and got["damaged"] == got["whole"]
    assert s.records_out + len(s.skipped) == 2


def test_an_m4a_with_a_frame_its_decoder_refuses_is_damaged(tmp_path):
    """Byte flips in an m4a's next-to-last AAC frame: FFmpeg's decoder refused it and the decode stopped there,
    47,104 of 49,024 samples read, within the slack kept for AAC's priming, and the recording was written that much
    shorter with no word. The packets after a refused one are decoded now (48,000-48,128 samples), and a packet of sound
    the decoder refuses makes the record's error."""
    import av

    src = tmp_path / "src"
    x = tone(3.0, 16000) + 0.05 * np.random.default_rng(1).standard_normal((48000, 1)).astype(np.float32)
    data = bytearray(write(src / "whole.m4a", x, 16000).read_bytes())
    with av.open(io.BytesIO(bytes(data))) as c:
        packets = [(p.pos, p.size) for p in c.demux(audio=0) if p.size]
    pos, size = packets[-2]
    data[pos : pos + size] = bytes(size)
    (src / "damaged.m4a").write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="webdataset", sample_rate=16000)
    assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["damaged"]
    import re  # (48,128 with PyAV 18's FFmpeg, 48,000 with PyAV 19's)

    assert re.match(r"decoded 4[78],\d{3} samples a channel where the header counts 49,024 \(Invalid data",
                    s.skipped[0]["reason"]), s.skipped[0]["reason"]


def test_mp3_files_joined_or_with_a_damaged_header_frame_keep_every_sample(tmp_path):
    """Two MP3 files one after the other (``cat a.mp3 b.mp3``): libsndfile counts and reads the first's samples
    alone (48,000 of 96,000), and the second's were lost without a word; byte flips in the first's Xing frame made
    it read 24,984 of 48,000. Where libsndfile counts fewer samples than the frames hold (walked from the first to
    the last), the file is read through PyAV, every frame."""
    import io

    import soundfile as sf

    from gpubatch.engine.codecs.audio_end import mp3_samples
    from gpubatch.engine.codecs.audio_io import decode_audio, probe_audio

    x = (0.3 * np.sin(np.arange(48000) * 2 * np.pi * 440 / 16000)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 16000, format="MP3")
    one = buf.getvalue()
    assert mp3_samples(one) == 86 * 576 and probe_audio(one).reader == "soundfile"
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.mp3").write_bytes(one)
    (src / "joined.mp3").write_bytes(one + one)
    assert sf.info(src / "joined.mp3").frames == 48000  # (libsndfile's count: the first file's)
    got = probe_audio(one + one)
    assert got.reader == "pyav" and got.frames == mp3_samples(one + one) >= 96000
    assert decode_audio(src / "joined.mp3").samples.shape[1] >= 96000
    s = convert(src, tmp_path / "out", to="webdataset", sample_rate=16000)
    assert s.records_out == 2 and not s.skipped
    lengths = {r.key: sf.info(io.BytesIO(r.data)).frames for r in open_dataset(tmp_path / "out")}
    assert lengths["one"] == 48000 and lengths["joined"] >= 96000, lengths
    tagged = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + one  # (each file's ID3v2 tag kept where they join)
    got = decode_audio(tagged + tagged).samples.shape[1]
    assert got >= 96000 - 2 * 1152, got
    side = bytearray(one)
    side[7] = 0x4A  # (a byte of the Xing frame's side information, as byte flips damaged it)
    if sf.info(io.BytesIO(bytes(side))).frames < 48000:  # (libsndfile's mpg123 counts half: the samples are whole)
        assert probe_audio(bytes(side)).reader == "pyav" and decode_audio(bytes(side)).samples.shape[1] == 48000


@pytest.mark.parametrize("vbr", [False, True])
def test_an_mp3_with_no_header_frame_is_read_whole(tmp_path, vbr):
    """An MP3 with no Xing/Info or VBRI frame (older encoders, stream rips): libsndfile guesses its length from the
    file's size and the first frame's rate. A CBR file with an ID3v2 tag had been refused as cut short (442,368
    samples decoded where the guess said 444,699); a VBR one was read to the guess, 159,324 of 441,000 samples, with
    no word. Its frames, walked, are its count; more than libsndfile's guess is read through PyAV."""
    import io

    import av

    from gpubatch.engine.codecs.audio_io import decode_audio, probe_audio

    def mp3(n: int) -> bytes:
        buf = io.BytesIO()
        with av.open(buf, "w", format="mp3", options={"write_xing": "0"}) as c:
            s = c.add_stream("libmp3lame", rate=44100)
            s.layout = "mono"
            if vbr:
                s.codec_context.qscale = 2
                s.codec_context.flags |= av.codec.context.Flags.qscale
            t = np.arange(n)
            x = 0.15 * np.sin(t * 2 * np.pi * 440 / 44100) * (1 + np.sin(t / 20000))
            x += 0.1 * np.random.default_rng(0).standard_normal(n) * (t > n // 2)  # (a louder half: VBR's rates vary)
            f = av.AudioFrame.from_ndarray(x.astype(np.float32)[None], format="fltp", layout="mono")
            f.sample_rate, f.pts = 44100, 0
            for p in [*s.encode(f), *s.encode(None)]:
                c.mux(p)
        return buf.getvalue()

    one = mp3(441000)
    for data, least in ((one, 441000), (one + mp3(220500), 661500)):
        got = decode_audio(data).samples.shape[1]
        assert least <= got <= least + 4 * 1152 and probe_audio(data).frames >= got, (vbr, least, got)


@pytest.mark.parametrize("kind", ["ogg", "opus"])
def test_a_chained_ogg_file_is_read_whole_not_its_first_stream_alone(tmp_path, kind):
    """Two Ogg Vorbis (or Opus) files one after the other (a chained Ogg file, as stream recorders write):
    libsndfile reads the first stream alone, and the second's samples had been lost without a word (16,000 of
    64,000 read; or, the longer first, 48,000 and no error at all). Its last page's stream differs from its first:
    it is read through PyAV, every stream, as many samples as its streams' last pages count."""
    import io

    import soundfile as sf

    from gpubatch.engine.codecs.container_end import ogg_chains

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(2)
    rate = 48000 if kind == "opus" else 16000
    parts = []
    for n in (16000, 48000):
        buf = io.BytesIO()
        sf.write(buf, 0.1 * rng.standard_normal(n).astype(np.float32), rate, format="OGG",
                 subtype="OPUS" if kind == "opus" else "VORBIS")
        parts.append(buf.getvalue())
    other = io.BytesIO()
    sf.write(other, 0.1 * rng.standard_normal(8000).astype(np.float32), 8000 if kind == "ogg" else 24000, format="OGG",
             subtype="OPUS" if kind == "opus" else "VORBIS")
    (src / f"short_first.{kind}").write_bytes(parts[0] + parts[1])
    (src / f"long_first.{kind}").write_bytes(parts[1] + parts[0])
    (src / f"whole.{kind}").write_bytes(parts[1])
    assert [n for _, _, n, _ in ogg_chains(parts[0] + parts[1])] == [16000, 48000]
    assert sf.info(src / f"short_first.{kind}").frames < 64000  # (libsndfile's count: the first stream's)
    s = convert(src, tmp_path / "out", to="webdataset", sample_rate=16000)
    assert s.records_out == 3 and not s.skipped
    lengths = {r.key: sf.info(io.BytesIO(r.data)).frames for r in open_dataset(tmp_path / "out")}
    want = 64000 if kind == "ogg" else 64000 // 3
    assert all(abs(lengths[k] - want) <= 300 for k in ("short_first", "long_first")), lengths
    if kind == "ogg":  # (an Opus stream decodes at 48 kHz whatever its input rate: nothing differs)
        (src / f"mixed.{kind}").write_bytes(parts[0] + other.getvalue())
        s = convert(src, tmp_path / "out2", to="webdataset", sample_rate=16000)
        assert s.records_out == 4 and not s.skipped, s.as_dict()
        lengths = {r.key: sf.info(io.BytesIO(r.data)).frames for r in open_dataset(tmp_path / "out2")}
        assert abs(lengths["mixed"] - 32000) <= 300, lengths


def test_a_chained_ogg_file_whose_streams_differ_in_rate_is_read_whole_each_stream_resampled(tmp_path):
    """A chained Ogg file of a 16-kHz stream and then a 44.1-kHz one (a stream recorder's, where the station changed
    its rate): FFmpeg's demuxer stops where the rate changes ("not yet implemented"), and the file had been its
    record's error. Each stream is now read on its own and resampled to the highest rate: every second of it is
    there, each tone where it was; passed through, the file is copied as it is. Streams of other channel counts
    stay the record's error, in one line."""
    import soundfile as sf

    from gpubatch.engine.codecs.audio_io import decode_audio, probe_audio
    from tests.audio.sounds import encoded

    first, second = encoded(tone(1.0, 16000, 300.0), 16000, "ogg"), encoded(tone(2.0, 44100, 900.0), 44100, "ogg")
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "mixed.ogg").write_bytes(first + second)
    (src / "a" / "one.ogg").write_bytes(second)
    got = probe_audio(first + second)
    assert (got.rate, got.channels, got.frames) == (44100, 1, 3 * 44100)
    x = decode_audio(first + second)
    assert x.samples.shape == (1, 3 * 44100) and x.rate == 44100

    def strongest(y):  # (Hz)
        return int(np.argmax(np.abs(np.fft.rfft(y))) * 44100 / len(y))

    assert strongest(x.samples[0, :44100]) == 300 and strongest(x.samples[0, 44100:]) == 900
    s = convert(src, tmp_path / "out", to="webdataset", sample_rate=16000)
    assert s.records_out == 2 and not s.skipped and not s.warnings, s.as_dict()
    rec = {r.key: r for r in open_dataset(tmp_path / "out")}["a/mixed"]
    assert abs(sf.info(io.BytesIO(rec.data)).frames - 48000) <= 2
    s = convert(src, tmp_path / "copy", to="webdataset")
    assert s.records_out == 2 and not s.skipped
    assert {r.key: r for r in open_dataset(tmp_path / "copy")}["a/mixed"].data == first + second
    (src / "a" / "mixed.ogg").write_bytes(first + encoded(tone(1.0, 44100, 900.0, channels=2), 44100, "ogg"))
    s = convert(src, tmp_path / "out2", to="webdataset", sample_rate=16000)
    assert [e["key"] for e in s.skipped] == ["a/mixed"]
    assert s.skipped[0]["reason"].startswith("a chained Ogg file whose 2 streams differ in channels "
                                             "(16,000 Hz x 1, 44,100 Hz x 2)"), s.skipped


def test_an_m4a_cut_inside_its_index_after_its_sample_tables_is_refused(tmp_path):
    """An M4A whose index (moov) comes last, cut 0.5% short: the cut took its metadata, not its sample tables, and
    the file passed through as whole, with no word (2026-12-07). Padding after a whole file is no cut."""
    whole = write(tmp_path / "whole.m4a", tone(3.0, 16000), 16000).read_bytes()
    assert whole.rfind(b"moov") > whole.rfind(b"mdat")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.m4a").write_bytes(whole[: int(len(whole) * 0.995)])
    (src / "b.m4a").write_bytes(whole + bytes(64))
    for opts in ({}, {"sample_rate": 8000}):
        s = convert(src, tmp_path / f"o{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a"], s.skipped
        assert s.skipped[0]["reason"] == "the file is cut short: its last box runs past its end"


@pytest.mark.parametrize("to", ["tfrecord", "lmdb"])
def test_a_sound_dataset_whose_first_record_is_damaged_still_reads_as_sound(tmp_path, to):
    """The reader's media was its first record's: a byte flipped there (a TFRecord's CRC fails; an LMDB's FLAC
    loses its magic) made a whole dataset of sound read as images, and a resample refused the run ("resample takes
    audio data, not image", 2026-12-07, `byte_flips.py --media stored`). Most of the first records decide."""
    for i in range(4):
        write(tmp_path / "src" / "a" / f"c{i}.flac", tone(1.0, 16000, 300 + 100 * i), 16000)
    convert(tmp_path / "src", tmp_path / "ds", to=to, **({"shard_size": 2} if to == "tfrecord" else {}))
    first = (tmp_path / "src" / "a" / "c0.flac").read_bytes()
    f = sorted((tmp_path / "ds").glob("data-00000*.tfrecord" if to == "tfrecord" else "*.mdb"))[0]
    data = bytearray(f.read_bytes())
    at = data.find(first[:64])
    assert at >= 0
    data[at + (0 if to == "lmdb" else 200)] ^= 0x55  # (LMDB: its magic; TFRecord: its frames, under the CRC)
    f.write_bytes(bytes(data))
    s = convert(tmp_path / "ds", tmp_path / "out", to="webdataset", sample_rate=8000)
    assert s.records_out == 3 and len(s.skipped) == 1, (s.records_out, s.skipped)
    assert "image" not in s.skipped[0]["reason"], s.skipped[0]


def test_a_tfrecord_of_sound_whose_every_record_fails_its_crc_names_that_not_its_media(tmp_path):
    """Every record damaged: the run still fails, but for its records' damage, not for "resample takes audio data,
    not image" (the media guessed from the features read past the CRC)."""
    from gpubatch.errors import GpubatchError

    for i in range(4):
        write(tmp_path / "src" / "a" / f"c{i}.flac", tone(1.0, 16000, 300 + 100 * i), 16000)
    convert(tmp_path / "src", tmp_path / "ds", to="tfrecord", shard_size=2)
    for f in (tmp_path / "ds").glob("*.tfrecord"):
        data = bytearray(f.read_bytes())
        for i in range(2):  # (a byte inside each of its two records' sound)
            data[300 + i * len(data) // 2] ^= 0x55
        f.write_bytes(bytes(data))
    with pytest.raises(GpubatchError, match=r"none of the 4 records .* \(CRC mismatch\)"):
        convert(tmp_path / "ds", tmp_path / "out", to="webdataset", sample_rate=8000)


def test_a_fragmented_m4a_with_no_index_of_its_fragments_at_its_end_is_said(tmp_path):
    """AAC in a fragmented MP4 cut exactly between two fragments read as a shorter whole recording: 24,576 of 49,024
    samples, with no word (2026-12-07). Whole (FFmpeg's muxer writes the fragments' index, ``mfra``, last): no
    warning; without it, its end is said to be unknown, and what it holds is written."""
    from tests.audio.sounds import fragmented_m4a
    from tests.helpers import mp4_boxes

    path = fragmented_m4a(tmp_path / "src" / "a" / "f.m4a", tone(3.0, 16000, 440)[:, 0])
    data = path.read_bytes()
    boxes = mp4_boxes(data)
    moofs = [a for k, a in boxes if k == b"moof"]
    assert len(moofs) >= 4 and boxes[-1][0] == b"mfra"
    for opts in ({"sample_rate": 16000}, {}):
        s = convert(tmp_path / "src", tmp_path / f"whole{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and not s.warnings and not s.skipped
    path.write_bytes(data[: moofs[len(moofs) // 2]])
    for opts in ({"sample_rate": 16000}, {}):
        s = convert(tmp_path / "src", tmp_path / f"cut{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and not s.skipped
        assert len(s.warnings) == 1 and "fragmented MP4 with no index of its fragments" in s.warnings[0], s.warnings
    # cut inside a fragment (its moof, 99 bytes in): 32,768 of 49,024 samples had been written with no word
    # (`byte_flips.py --media audio --cut --exact --seed 223`, 2026-12-07); the record's error now
    (tmp_path / "src" / "a" / "whole.m4a").write_bytes(data)
    path.write_bytes(data[: moofs[len(moofs) // 2] + 99])
    for opts in ({"sample_rate": 16000}, {}):
        s = convert(tmp_path / "src", tmp_path / f"inside{len(opts)}", to="webdataset", **opts)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a/f"], s.as_dict()
        assert "a fragment (moof, mdat) of it, and what came after, is lost" in s.skipped[0]["reason"]


@pytest.mark.parametrize("subtype", ["VORBIS", "OPUS"])
def test_an_ogg_file_cut_between_two_pages_is_cut_short_not_shorter(tmp_path, subtype):
    """An Ogg file cut exactly at a page's start read as a shorter whole recording, in a copy and decoded: 60,544 of
    160,000 samples with no word (10 s of Vorbis; `benchmarks/boundary_cuts.py` at 1dff6d9). Every Ogg stream's last page carries the end-of-stream flag; the cut
    file's last page does not: its record's error, and ``info`` lists it unreadable. The whole file passes."""
    src = tmp_path / "src"
    src.mkdir()
    rate = 16000 if subtype == "VORBIS" else 48000
    x = tone(10.0, rate) + 0.05 * np.random.default_rng(0).standard_normal((10 * rate, 1)).astype(np.float32)
    sf.write(src / "whole.ogg", x, rate, format="OGG", subtype=subtype)
    data = (src / "whole.ogg").read_bytes()
    pages = _ogg_pages(data)
    assert len(pages) >= 6 and data[pages[-1][0] + 5] & 0x04  # (the whole file's last page ends its stream)
    (src / "cut.ogg").write_bytes(data[: pages[len(pages) // 2][0]])
    _refused_copied_and_decoded(src, tmp_path, "cut", "its last Ogg page does not end its stream")


@pytest.mark.parametrize("rate,channels", [(16000, 1), (44100, 2)])
def test_an_mp3_whose_lame_tag_is_damaged_is_said(tmp_path, rate, channels):
    """One byte of an MP3's LAME tag damaged, in its encoder padding: every decoder trimmed 85 samples more from its
    end with no error (seed 33 of `byte_flips.py --media stored --loader`, 2026-12-07). The tag's CRC-16 tells: a
    warning names the file and the delay and padding it gives, on the pass-through and the decode; a whole file
    says nothing of it."""
    from gpubatch.engine.codecs.audio_end import lame_tag_damage

    whole = write(tmp_path / "src" / "a" / "whole.mp3", tone(2.0, rate, 440.0, channels), rate)
    data = bytearray(whole.read_bytes())
    tag = data.index(b"LAME")
    assert lame_tag_damage(bytes(data[:4096])) == ""
    data[tag + 23] ^= 0x55  # (the last byte of the delay and padding: the padding's low bits)
    assert sf.info(io.BytesIO(bytes(data))).frames != sf.info(whole).frames  # (what decoders now trim)
    (tmp_path / "src" / "a" / "tag.mp3").write_bytes(bytes(data))
    assert "its MP3 LAME tag is damaged" in lame_tag_damage(bytes(data[:4096]))
    for i, opts in enumerate(({}, {"sample_rate": RATE})):
        s = convert(tmp_path / "src", tmp_path / f"out{i}", to="webdataset", **opts)
        assert s.records_out == 2 and not s.skipped, s.as_dict()
        assert len(s.warnings) == 1 and s.warnings[0].startswith("a/tag: its MP3 LAME tag is damaged"), s.warnings
        trims = int.from_bytes(data[tag + 21 : tag + 24], "big")
        assert f"({trims >> 12} and {trims & 0xFFF} samples)" in s.warnings[0], s.warnings


def _the_damaged_one_skipped(tmp_path, files: dict) -> str:
    """``files`` (name -> bytes; the first damaged, the others whole) converted: the first alone skipped, its reason."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for name, data in files.items():
        (src / "a" / name).write_bytes(data)
    s = convert(src, tmp_path / "out", to="webdataset", sample_rate=16000)
    damaged = "a/" + next(iter(files)).rsplit(".", 1)[0]
    assert s.records_out == len(files) - 1 and [e["key"] for e in s.skipped] == [damaged], s.as_dict()
    return s.skipped[0]["reason"]


@pytest.mark.parametrize("second_rate", [16000, 44100])
def test_a_chained_ogg_file_whose_second_stream_s_header_is_damaged_is_its_record_s_error(tmp_path, second_rate):
    """A chained Ogg file whose second stream's first page lost its identification header (byte flips, seed 83 of
    `byte_flips.py --media audio --exact`, 2026-12-07): no decoder reads that stream, and the file was written with
    the first stream's samples alone (24,000 of 48,000), no word. A stream of no readable header is now the record's
    error, whether the streams share a rate or not."""
    from tests.audio.sounds import encoded

    first, second = encoded(tone(1.0, 16000, 300.0), 16000, "ogg"), encoded(tone(1.0, second_rate, 900.0), second_rate,
                                                                           "ogg")
    damaged = bytearray(first + second)
    head = len(first) + 27 + damaged[len(first) + 26]  # (the second stream's first page's body: "\x01vorbis"...)
    assert damaged[head : head + 7] == b"\x01vorbis"
    damaged[head + 1] ^= 0x20
    reason = _the_damaged_one_skipped(tmp_path, {"chain.ogg": bytes(damaged), "whole.ogg": first + second})
    assert f"the one from byte {len(first):,} with no readable header (damaged)" in reason


def test_an_ogg_stream_of_another_kind_is_no_damaged_stream():
    """A Skeleton index stream (its first page "fishead", its granules 0) beside the sound is left out of a chained
    Ogg file's streams, as before; a stream of sound whose header is gone is kept, of rate 0 (its record's error)."""
    from gpubatch.engine.codecs.container_end import ogg_chains
    from tests.audio.sounds import encoded

    def page(serial: int, body: bytes, flags: int = 2, granule: int = 0) -> bytes:
        return (b"OggS\x00" + bytes([flags]) + granule.to_bytes(8, "little") + serial.to_bytes(4, "little")
                + bytes(8) + bytes([1, len(body)]) + body)

    first, second = encoded(tone(1.0, 16000), 16000, "ogg"), encoded(tone(1.0, 44100), 44100, "ogg")
    skeleton = page(7, b"fishead\x00" + bytes(56))
    got = ogg_chains(skeleton + first + second)
    assert [(rate, n, at) for rate, _, n, at in got] == [(16000, 16000, len(skeleton)),
                                                          (44100, 44100, len(skeleton) + len(first))]
    lost = page(9, b"\x01Vorbis" + bytes(23)) + page(9, b"audio", flags=4, granule=4800)
    assert [rate for rate, *_ in ogg_chains(first + lost)] == [16000, 0]


def test_an_mp3_whose_frame_header_is_damaged_is_its_record_s_error(tmp_path):
    """One byte of an MP3 frame's header damaged (its sync), in a file after an ID3 tag: libsndfile's count no longer
    agreed with the header frame's, the frames were walked and read through PyAV, and the decoders passed over the
    frame with no error: 47,855 of 48,000 samples written, no word (`byte_flips.py --media audio --exact --seed
    234`, 2026-12-07). A stretch between frames that holds none, and is no tag, is now the record's error; MP3 files
    joined one after another (their tags between them) still read whole."""
    from gpubatch.engine.codecs.audio_end import _mp3_frame, mp3_samples
    from tests.audio.sounds import encoded

    title = b"\x03" + b"a title" * 40  # (an ID3v2.3 tag before the frames: a title frame)
    frame = b"TIT2" + len(title).to_bytes(4, "big") + b"\x00\x00" + title
    tag = b"ID3\x03\x00\x00" + bytes((len(frame) >> shift) & 0x7F for shift in (21, 14, 7, 0)) + frame
    one = tag + encoded(tone(3.0, 16000), 16000, "mp3")
    frames, at = [], len(tag)
    while (n := _mp3_frame(one, at)) and len(frames) < 8:
        frames.append(at)
        at += n
    damaged = bytearray(one)
    damaged[frames[1] + 1] = 0x79  # (the first sound frame's header, after the Info frame: no frame)
    stretches: list = []
    assert mp3_samples(bytes(damaged), stretches) < mp3_samples(one) and stretches[0][0] == frames[1]
    reason = _the_damaged_one_skipped(tmp_path, {"chain.mp3": bytes(damaged), "joined.mp3": one + one})
    assert f"the MP3 is damaged: {frames[2] - frames[1]:,} bytes at byte {frames[1]:,} hold no frame" in reason
