"""Audio on the CPU: every source layout, decoding every codec, features against their reference
definitions, resampling against soxr, outputs read back by the webdataset library and the tfrecord
package, augment reproducible by seed, and bad input (a per-file skip with its reason, the rest converts)."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from gpubatch.api import augment, convert, info
from gpubatch.errors import UsageError

from ..helpers import run_cli
from .sounds import encoded, speech_commands, tone, write

# --- references, written out independently of gpubatch's code ----------------------------------------


def _slaney_mel(f):
    f = np.asarray(f, np.float64)
    return np.where(f < 1000, 3 * f / 200, 15 + 27 * np.log(np.maximum(f, 1e-9) / 1000) / np.log(6.4))


def _slaney_hz(m):
    m = np.asarray(m, np.float64)
    return np.where(m < 15, 200 * m / 3, 1000 * np.exp(np.log(6.4) * (m - 15) / 27))


def mel_bank_reference(rate, n_fft, n_mels):
    """librosa.filters.mel(sr, n_fft, n_mels) (Slaney scale, Slaney norm), band by band."""
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = _slaney_hz(np.linspace(_slaney_mel(0), _slaney_mel(rate / 2), n_mels + 2))
    bank = np.zeros((n_mels, len(bins)))
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        rise = (bins - lo) / (mid - lo)
        fall = (hi - bins) / (hi - mid)
        bank[m] = np.maximum(0, np.minimum(rise, fall)) * 2 / (hi - lo)
    return bank


def whisper_reference(x, n_mels=80):
    """Whisper's log_mel_spectrogram (whisper/audio.py) in NumPy, frame by frame."""
    n_fft, hop = 400, 160
    window = np.hanning(n_fft + 1)[:-1]  # torch.hann_window(400): periodic
    padded = np.pad(np.asarray(x, np.float64), n_fft // 2, mode="reflect")
    count = 1 + (len(padded) - n_fft) // hop
    stft = np.stack([np.fft.rfft(padded[i * hop: i * hop + n_fft] * window) for i in range(count)], 1)
    mags = np.abs(stft[:, :-1]) ** 2
    log = np.log10(np.clip(mel_bank_reference(16000, n_fft, n_mels) @ mags, 1e-10, None))
    return (np.maximum(log, log.max() - 8.0) + 4.0) / 4.0


def _run(ops_text, x, rate):
    from gpubatch.engine.codecs.audio import AudioData, AudioHostCodec
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    plan = Plan(ops=parse_chain(ops_text), media="audio", max_pixels=0)
    item = AudioData(np.asarray(x, np.float32).reshape(1, -1) if np.ndim(x) == 1 else x, rate)
    return AudioHostCodec().run_chain(plan.ops, item, plan.draw("k", *item.size))


def speechy(seconds=2.0, rate=16000, seed=0):
    from gpubatch.synthetic import speech_like

    return speech_like(np.random.default_rng(seed), seconds, rate)


# --- features -----------------------------------------------------------------------------------------


def test_log_mel_is_whispers_definition():
    x = speechy(3.0)
    out = _run("log_mel(n_mels=80)", x, 16000)
    ref = whisper_reference(x)
    assert out.samples.shape == (1, 80, 300) == (1, *ref.shape)
    assert np.abs(out.samples[0] - ref).max() <= 1e-3
    assert out.features == "log_mel"


def test_mel_filters_match_the_reference_bank_and_128_bins():
    from gpubatch.engine.ops.spectral import mel_filters

    for n_mels in (64, 80, 128):
        assert np.abs(mel_filters(16000, 400, n_mels) - mel_bank_reference(16000, 400, n_mels)).max() < 1e-6


def test_mfcc_is_the_orthonormal_dct_of_power_to_db():
    x = speechy(1.0)
    out = _run("mfcc(n_mfcc=20, n_mels=40, pad='constant')", x, 16000).samples[0]
    mel = _run("mel(n_mels=40, pad='constant')", x, 16000).samples[0].astype(np.float64)
    db = 10 * np.log10(np.maximum(mel, 1e-10))
    db = np.maximum(db, db.max() - 80)
    n = np.arange(40)
    dct = np.array([np.sqrt((1 if k == 0 else 2) / 40) * np.cos(np.pi * k * (2 * n + 1) / 80) for k in range(20)])
    assert out.shape == (20, 101)
    assert np.abs(out - dct @ db).max() < 1e-3
    librosa = pytest.importorskip("librosa", reason="librosa not installed: MFCC checked against its formula above")
    ref = librosa.feature.mfcc(y=x, sr=16000, n_mfcc=20, n_mels=40, n_fft=400, hop_length=160, htk=False)
    assert np.abs(out - ref).max() < 1e-2


def test_spectrogram_frames_and_padding():
    x = tone(0.1, 16000)[:, 0]
    s = _run("spectrogram(n_fft=400, hop=160)", x, 16000).samples[0]
    assert s.shape == (201, 1 + 1600 // 160)
    peak = np.argmax(s[:, 5])
    assert abs(peak * 16000 / 400 - 440) <= 40  # the tone's bin
    mag = _run("spectrogram(n_fft=400, hop=160, power=1.0)", x, 16000).samples[0]
    assert np.allclose(mag ** 2, s, rtol=1e-3, atol=1e-3)
    mel = _run("mel(n_mels=40)", x, 16000).samples[0]
    assert np.allclose(mel, mel_bank_reference(16000, 400, 40) @ s, rtol=1e-4, atol=1e-4)


# --- resampling ---------------------------------------------------------------------------------------


def _snr(ref, got):
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2))


@pytest.mark.parametrize("src,dst", [(44100, 16000), (48000, 16000), (8000, 16000), (22050, 44100)])
def test_resampling_against_soxr_on_a_tone(src, dst):
    """The GPU kernel's polyphase filter (run here in NumPy) against soxr, on a test tone: SNR >= 80 dB."""
    import soxr

    from gpubatch.engine.ops.audio import ratio, resample_poly_np

    x = tone(0.25, src, 1000)[:, 0]
    up, down = ratio(src, dst)
    got = resample_poly_np(x[None], up, down)[0]
    ref = soxr.resample(x, src, dst, quality="VHQ")[: len(got)]
    edge = dst // 50  # both resamplers' start and end transients left out
    assert _snr(ref[edge:-edge], got[edge: len(ref) - edge]) >= 80
    cpu = _run(f"resample(rate={dst})", x, src)
    assert cpu.rate == dst and cpu.samples.shape[-1] == len(got)  # both backends make the same length


def test_speed_and_fixed_lengths_follow_the_drawn_sizes():
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    plan = Plan(ops=parse_chain("speed(factors=(0.9, 1.1)) | time_crop(seconds=0.5) | fix_duration(seconds=0.75, "
                                "pad='repeat')"), media="audio", max_pixels=0, seed=3)
    out = _run("speed(factors=(1.1,))", tone(1.0)[:, 0], 16000)
    assert out.samples.shape[-1] == 14546 and out.rate == 16000  # 16000 / 1.1, rounded up
    assert plan.out_hw(16000, 16000, plan.draw("k", 16000, 16000)) == (16000, 12000)


# --- sources ------------------------------------------------------------------------------------------


def test_speech_commands_class_folders(tmp_path):
    root = speech_commands(tmp_path / "sc")
    rep = info(root)
    assert rep.format == "audio" and rep.records == 6 and rep.classes == ["no", "up", "yes"]
    assert any("_background_noise_" in w for w in rep.warnings)
    assert rep.audio["sample_rates"] == {16000: 6} and rep.audio["duration_s"]["max"] == 0.6


def test_esc50_csv_keeps_its_own_numbering(tmp_path):
    root = tmp_path / "ESC-50"
    rows = [("1-1-A-0.wav", 1, 0, "dog"), ("1-2-A-10.wav", 1, 10, "rain"), ("2-3-B-0.wav", 2, 0, "dog")]
    for name, *_ in rows:
        write(root / "audio" / name, tone(0.2), 16000)
    (root / "meta").mkdir()
    (root / "meta" / "esc50.csv").write_text("filename,fold,target,category,esc10,src_file,take\n" + "".join(
        f"{n},{f},{t},{c},False,1,A\n" for n, f, t, c in rows))
    (root / "README.md").write_text("ESC-50")
    s = convert(root, tmp_path / "o", to="webdataset")
    assert s.records_out == 3
    from gpubatch import open_dataset

    with open_dataset(tmp_path / "o") as ds:
        labels = {r.key: r.label for r in ds}
    assert sorted(labels.values()) == [0, 0, 10]
    rep = info(root)
    assert rep.classes[0] == "dog" and rep.classes[10] == "rain"


@pytest.mark.parametrize("opts", [{}, {"sample_rate": 8000}], ids=["pass-through", "decode"])
def test_a_csv_label_beyond_any_class_index_is_that_rows_error(tmp_path, opts):
    """A target of 10^20 in ESC-50's CSV: its row is listed, the others written. Re-encoded, the run had ended in an
    OverflowError: the class table was sized by it."""
    root = tmp_path / "ESC-50"
    rows = [("1-1-A-0.wav", 0, "dog"), ("1-2-A-10.wav", 10**20, "rain"), ("2-3-B-0.wav", 0, "dog")]
    for name, *_ in rows:
        write(root / "audio" / name, tone(0.2), 16000)
    (root / "meta").mkdir()
    (root / "meta" / "esc50.csv").write_text("filename,fold,target,category\n" + "".join(
        f"{n},1,{t},{c}\n" for n, t, c in rows))
    s = convert(root, tmp_path / "o", to="webdataset", device="cpu", **opts)
    assert s.records_out == 2 and len(s.skipped) == 1 and "outside 0..2,147,483,647" in s.skipped[0]["reason"]


def test_csv_columns_named_on_the_command_line(tmp_path):
    root = tmp_path / "d"
    write(root / "clips" / "a.flac", tone(0.2), 16000)
    write(root / "clips" / "b.flac", tone(0.2), 16000)
    (root / "list.csv").write_text("wav,speaker\nclips/a.flac,alice\nclips/b.flac,bob\n")
    p = run_cli("convert", root, tmp_path / "o", "--to", "audio", "--path-column", "wav", "--label-column", "speaker")
    assert p.returncode == 0, p.stderr
    assert "clips/a.flac" not in (tmp_path / "o" / "metadata.csv").read_text()
    assert (tmp_path / "o" / "alice" / "a.flac").read_bytes() == (root / "clips" / "a.flac").read_bytes()
    p = run_cli("convert", root, tmp_path / "o2", "--to", "audio", "--path-column", "nope")
    assert p.returncode != 0 and "no path column 'nope'" in p.stderr and "Traceback" not in p.stderr


def test_librispeech_transcripts_are_kept_as_text(tmp_path):
    d = tmp_path / "LibriSpeech" / "19" / "198"
    write(d / "19-198-0000.flac", tone(0.3), 16000)
    write(d / "19-198-0001.flac", tone(0.3), 16000)
    (d / "19-198.trans.txt").write_text("19-198-0000 NORTHANGER ABBEY\n19-198-0001 CHAPTER ONE\n")
    convert(tmp_path / "LibriSpeech", tmp_path / "o", to="tfrecord")
    from gpubatch import open_dataset

    with open_dataset(tmp_path / "o") as ds:
        texts = sorted(r.meta["text"] for r in ds)
    assert texts == ["CHAPTER ONE", "NORTHANGER ABBEY"]
    tfrecord = pytest.importorskip("tfrecord")
    shard = next((tmp_path / "o").glob("*.tfrecord"))
    recs = list(tfrecord.tfrecord_loader(str(shard), str(shard.with_suffix(".idx")) if shard.with_suffix(".idx").exists()
                                         else None))
    assert {bytes(r["audio/text"]).decode() for r in recs} == {"CHAPTER ONE", "NORTHANGER ABBEY"}
    assert {int(r["audio/sample_rate"][0]) for r in recs} == {16000}  # passed through: the rate from the header


@pytest.mark.parametrize("fmt,subtype", [("wav", "PCM_U8"), ("wav", "PCM_16"), ("wav", "PCM_24"), ("wav", "PCM_32"),
                                         ("wav", "FLOAT"), ("flac", None), ("ogg", None), ("mp3", None), ("m4a", None)])
def test_every_codec_decodes(fmt, subtype):
    from gpubatch.engine.codecs.audio import decode_audio, probe_audio

    x = tone(0.5, 16000, 440, channels=2)
    data = encoded(x, 16000, fmt, subtype)
    inf = probe_audio(data)
    assert inf.rate == 16000 and inf.channels == 2
    got = decode_audio(data, inf)
    assert got.samples.shape[0] == 2 and got.rate == 16000
    n = min(got.samples.shape[1], 8000)
    lossy = fmt in ("ogg", "mp3", "m4a")
    if not lossy:
        assert np.abs(got.samples[:, :n] - x[:n].T).max() < (0.01 if subtype == "PCM_U8" else 1e-3)
    else:  # a lossy codec keeps the tone's power (after its start-up delay)
        assert abs(np.sqrt(np.mean(got.samples[0, 2000:6000] ** 2)) - 0.5 / np.sqrt(2)) < 0.05


# --- convert, augment ---------------------------------------------------------------------------------


def test_features_to_webdataset_read_back_by_the_webdataset_library(tmp_path):
    wds = pytest.importorskip("webdataset")
    root = speech_commands(tmp_path / "sc")
    p = run_cli("convert", root, tmp_path / "o", "--to", "webdataset", "--sample-rate", "16000", "--mono",
                "--duration", "1", "--features", "log-mel(n_mels=80)", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    ds = wds.WebDataset(sorted(str(s) for s in (tmp_path / "o").glob("*.tar")), shardshuffle=False)
    got = {s["__key__"]: (np.load(io.BytesIO(s["npy"])), int(s["cls"])) for s in ds}
    assert len(got) == 6 and {a.shape for a, _ in got.values()} == {(80, 100)}
    assert {a.dtype for a, _ in got.values()} == {np.dtype(np.float16)}
    a, _ = got["yes/0000_nohash_0"]
    x = sf.read(str(root / "yes" / "0000_nohash_0.wav"), dtype="float32")[0]
    ref = whisper_reference(np.pad(x, (0, 16000 - len(x))))
    assert np.abs(a.astype(np.float32) - ref).max() < 2e-3  # float16's step near 1
    meta = json.loads(next(iter(wds.WebDataset(str(next((tmp_path / "o").glob("*.tar"))), shardshuffle=False)))["json"])
    assert meta["meta"]["features"] == "log_mel" and meta["meta"]["sample_rate"] == 16000


def test_resample_to_flac_keeps_labels_and_lengths(tmp_path):
    root = speech_commands(tmp_path / "sc", rate=44100)
    s = convert(root, tmp_path / "o", to="audio", sample_rate=16000, audio_format="flac", device="cpu")
    assert s.records_out == 6 and s.transcoded == 6
    out = sf.info(str(tmp_path / "o" / "up" / "0001_nohash_0.flac"))
    assert out.samplerate == 16000 and out.frames == 9600 and out.format == "FLAC"
    assert "up/0001_nohash_0.flac,1,up," in (tmp_path / "o" / "metadata.csv").read_text()


def test_pass_through_is_byte_for_byte(tmp_path):
    root = speech_commands(tmp_path / "sc")
    convert(root, tmp_path / "o", to="webdataset")
    import tarfile

    with tarfile.open(next((tmp_path / "o").glob("*.tar"))) as t:
        member = t.extractfile("yes/0001_nohash_0.wav").read()
    assert member == (root / "yes" / "0001_nohash_0.wav").read_bytes()


def test_augment_is_reproducible_by_seed(tmp_path):
    root = speech_commands(tmp_path / "sc")
    chain = "gain(db=(-6, 6)) | add_noise(snr=(10, 20)) | time_shift(seconds=0.05) | speed()"
    outs = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        augment(root, tmp_path / name, ops=chain, seed=seed, copies=2, to="audio", audio_format="wav", device="cpu")
        outs.append({p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*.wav")})
    assert len(outs[0]) == 12 and outs[0] == outs[1] and outs[0] != outs[2]
    params = (tmp_path / "a" / "augment-params.jsonl").read_text().splitlines()
    assert len(params) == 12


def test_spec_augment_masks_take_features():
    from gpubatch.engine.codecs.audio import AudioData, AudioHostCodec
    from gpubatch.engine.ops.spectral import FreqMask, TimeMask

    feats = AudioData(np.ones((1, 80, 100), np.float32), 16000, "log_mel")
    out = AudioHostCodec().run_chain((FreqMask(10, 2, -1.0), TimeMask(20, 1, -2.0)), feats,
                                     [[(5, 3), (70, 10)], [(40, 20)]]).samples[0]
    assert (out[5:8, :40] == -1).all() and (out[70:80, 60:] == -1).all() and (out[:, 40:60] == -2).all()
    assert (np.delete(np.delete(out, np.r_[5:8, 70:80], 0), np.r_[40:60], 1) == 1).all()
    assert feats.samples.min() == 1  # the input is left as it was
    from gpubatch.engine.registry import get_kernel

    rng = np.random.default_rng(0)  # a batch of two shapes, masked at once, as one by one
    batch = [AudioData(rng.normal(size=shape).astype(np.float32), 16000, "log_mel")
             for shape in ((1, 40, 30), (2, 40, 30), (1, 40, 30), (1, 20, 50))]
    params = [[(3, 4)], [(0, 2), (10, 5)], [], [(19, 1)]]
    together = get_kernel("freq_mask", "host")(FreqMask(5, 2, -3.0), batch, params)
    for item, p, got in zip(batch, params, together):
        alone = get_kernel("freq_mask", "host")(FreqMask(5, 2, -3.0), [item], [p])[0]
        assert np.array_equal(got.samples, alone.samples) and got.samples.shape == item.samples.shape
    from gpubatch.engine.ops.audio import (  # the other ops run a shape at a time the same way
        FixDuration,
        Gain,
    )

    waves = [AudioData(rng.normal(size=shape).astype(np.float32), rate) for shape, rate in
             (((1, 900), 1000), ((1, 900), 1000), ((2, 900), 1000), ((1, 900), 2000), ((1, 1700), 1000))]
    for op, ps in ((FixDuration(1.3, "repeat"), [None] * 5), (Gain(), [0.5, 2.0, 1.5, 0.25, 3.0])):
        together = get_kernel(op.name, "host")(op, waves, ps)
        for item, p, got in zip(waves, ps, together):
            assert np.array_equal(got.samples, get_kernel(op.name, "host")(op, [item], [p])[0].samples), op.name
    assert [w.samples.shape[-1] for w in get_kernel("fix_duration", "host")(FixDuration(1.3), waves, [None] * 5)] == \
        [1300, 1300, 1300, 2600, 1300]
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    with pytest.raises(UsageError, match="freq_mask takes features"):
        Plan(ops=parse_chain("freq_mask(width=10) | log_mel()"), media="audio").validate("host")


def test_mono_gain_shift_crop_and_lengths_are_their_definitions():
    from gpubatch.engine.codecs.audio import AudioData, AudioHostCodec
    from gpubatch.engine.spec import parse_chain

    x = np.stack([np.arange(10, dtype=np.float32), -np.arange(10, dtype=np.float32) / 2])
    run = AudioHostCodec().run_chain
    item = AudioData(x, 10)
    assert np.array_equal(run(parse_chain("mono()"), item, [None]).samples, x.mean(0, keepdims=True))
    assert np.allclose(run(parse_chain("gain(db=6)"), item, [2.0]).samples, 2 * x)
    shifted = run(parse_chain("time_shift(seconds=0.3)"), item, [3]).samples
    assert np.array_equal(shifted[:, 3:], x[:, :7]) and not shifted[:, :3].any()
    assert np.array_equal(run(parse_chain("time_shift(seconds=0.3)"), item, [-2]).samples[:, :8], x[:, 2:])
    assert np.array_equal(run(parse_chain("time_crop(seconds=0.4)"), item, [5]).samples, x[:, 5:9])
    assert np.array_equal(run(parse_chain("time_crop(seconds=1.5)"), item, [0]).samples[:, 10:], np.zeros((2, 5)))
    rep = run(parse_chain("fix_duration(seconds=2.5, pad='repeat')"), item, [None]).samples
    assert np.array_equal(rep, np.tile(x, 3)[:, :25])
    assert run(parse_chain("fix_duration(seconds=0.5)"), item, [None]).samples.shape == (2, 5)


def test_add_noise_reaches_its_snr():
    x = speechy(2.0)
    out = _run("add_noise(snr=20)", x, 16000).samples[0]
    assert abs(_snr(x.astype(np.float64), out.astype(np.float64)) - 20) < 0.5


# --- bad input ----------------------------------------------------------------------------------------


def _wav_header(rate: int, channels: int, frames: int = 100) -> bytes:
    data = b"\0" * (frames * channels * 2)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)


def test_bad_files_are_skipped_with_reasons_and_the_rest_converts(tmp_path):
    root = tmp_path / "bad" / "cls"
    write(root / "good.wav", tone(0.3), 16000)
    write(root / "good_too.flac", tone(0.3), 16000)
    (root / "wav_named_flac.flac").write_bytes(encoded(tone(0.3), 16000, "wav"))
    (root / "empty.wav").write_bytes(b"")
    (root / "truncated.flac").write_bytes(encoded(tone(1.0), 16000, "flac")[:60])
    (root / "zero_hz.wav").write_bytes(_wav_header(0, 1))
    (root / "forty_channels.wav").write_bytes(_wav_header(16000, 40))
    nan = tone(0.3)
    nan[100] = np.nan
    write(root / "nan.wav", nan, 16000, subtype="FLOAT")
    (root / "not_audio.mp3").write_bytes(b"hello, world" * 10)
    corrupt = bytearray(encoded(speechy(2.0)[:, None], 16000, "flac"))
    corrupt[len(corrupt) // 2: len(corrupt) // 2 + 400] = bytes(400)
    (root / "corrupt_frames.flac").write_bytes(bytes(corrupt))
    s = convert(tmp_path / "bad", tmp_path / "o", to="webdataset", sample_rate=8000, device="cpu")
    reasons = {e["key"].rsplit("/", 1)[-1]: e["reason"] for e in s.skipped}
    assert s.records_out == 3 and len(reasons) == 7  # the three readable files are written, by content
    assert not {"good", "good_too", "wav_named_flac"} & set(reasons)
    assert "empty file" in reasons["empty"]
    assert "outside 1,000-768,000 Hz" in reasons["zero_hz"]
    assert "40 channels" in reasons["forty_channels"]
    assert "NaN" in reasons["nan"]
    assert "truncated" in reasons and "not an audio file" in reasons["not_audio"]
    assert "cannot decode" in reasons["corrupt_frames"] and "flac decoder" in reasons["corrupt_frames"]


def test_long_files_are_read_only_as_far_as_a_leading_duration(tmp_path, monkeypatch):
    from gpubatch.engine.codecs import audio as codec

    write(tmp_path / "d" / "long.flac", speechy(20.0), 16000)
    reads = []
    real = codec.decode_audio
    monkeypatch.setattr(codec, "decode_audio", lambda *a, **k: reads.append(k.get("seconds", a[3] if len(a) > 3 else None))
                        or real(*a, **k))
    convert(tmp_path / "d", tmp_path / "o", to="audio", duration=1.0, device="cpu", workers=1)
    assert reads == [1.0]
    assert sf.info(str(next((tmp_path / "o").rglob("*.flac")))).frames == 16000


def test_audio_option_errors_are_one_line(tmp_path):
    root = speech_commands(tmp_path / "sc")
    for args, words in ((["--features", "blur()"], "--features takes one of"),
                        (["--features", "log-mel(n_mels=-1)"], "--features: log-mel n_mels must be a positive integer"),
                        (["--features", "mfcc(n_mel=40)"], "unknown parameter 'n_mel' (did you mean 'n_mels'?)"),
                        (["--pad", "repeat"], "--pad needs --duration"),
                        (["--resize-shorter", "10"], "takes image or video data, not audio")):
        p = run_cli("convert", root, tmp_path / "o", "--to", "webdataset", *args)
        assert p.returncode != 0 and words in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert not (tmp_path / "o").exists()
    for to in ("recordio", "coco"):  # (refused before any worker starts: no worker's traceback, no staging left)
        p = run_cli("convert", root, tmp_path / "o", "--to", to)
        assert p.returncode != 0 and f"{to} holds image records, not audio" in p.stderr and "Traceback" not in p.stderr
        assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o*")), list(tmp_path.iterdir())


def test_audio_pipeline_on_the_cpu(tmp_path):
    from gpubatch import AudioPipeline
    from gpubatch.engine.spec import parse_chain

    root = speech_commands(tmp_path / "sc", rate=8000)
    files = sorted(root.glob("[!_]*/*.wav"))
    ops = parse_chain("resample(rate=16000) | fix_duration(seconds=1) | log_mel(n_mels=64) | time_mask(width=10)")
    with AudioPipeline(ops, device="cpu", workers=2, seed=5) as pipe:
        batches = list(pipe.iterate_files(files, batch_size=4))
    assert [b.data.shape for b in batches] == [(4, 64, 100), (2, 64, 100)]
    assert batches[0].data.dtype == np.float16


def test_shared_memory_feed_gives_what_libsndfile_decodes(tmp_path):
    """The GPU pipeline's feed (worker processes decoding into shared memory), checked on the CPU: every
    file's samples as decode_audio gives them (mono and stereo, files larger than a slab, a damaged one)."""
    from gpubatch.engine.codecs.audio import decode_audio
    from gpubatch.engine.gpu.audio_feed import DecodeWorkers, SharedFeed

    files = [write(tmp_path / f"m{i}.flac", tone(0.2 + 0.1 * i), 16000) for i in range(5)]
    files.append(write(tmp_path / "stereo.wav", tone(0.3, 8000, channels=2), 8000))
    files.append(write(tmp_path / "big.wav", tone(2.0), 16000))  # more than a 64 KiB slab holds
    files.append(write(tmp_path / "huge.wav", tone(3.0), 16000))  # above the bound on one record
    (tmp_path / "bad.wav").write_bytes(b"RIFF" + bytes(40))
    files.append(tmp_path / "bad.wav")
    pool = DecodeWorkers(2)
    feed = SharedFeed(pool, slabs=3, per_task=3, slab_bytes=1 << 16, max_samples=40000)
    try:
        got = {}
        for key, item, where in feed.items(iter((str(f), f.stem) for f in files), None):
            got[key] = item if hasattr(item, "reason") else np.array(item.samples)
            feed.release(where[0] if where else None)
    finally:
        feed.close()
        pool.close()
    assert "not an audio file" in got.pop("bad").reason
    assert "above the 40,000-sample bound" in got.pop("huge").reason
    assert len(got) == 7
    for f in files[:-2]:
        assert np.array_equal(got[f.stem], decode_audio(str(f)).samples), f.stem


def test_features_and_clips_in_lmdb(tmp_path):
    """LMDB holds audio as Caffe Datums (the file's bytes, or float16 .npy features) with the label."""
    root = speech_commands(tmp_path / "sc")
    s = convert(root, tmp_path / "feat", to="lmdb", features="log-mel(n_mels=64)", duration=0.5, device="cpu")
    assert s.records_out == 6
    from gpubatch import open_dataset

    with open_dataset(tmp_path / "feat") as ds:
        recs = list(ds)
    assert {r.codec for r in recs} == {"npy"} and sorted(r.label for r in recs) == [0, 0, 1, 1, 2, 2]
    assert np.load(io.BytesIO(recs[0].data)).shape == (64, 50)  # Whisper drops the last frame
    convert(root, tmp_path / "clips", to="lmdb")
    rep = info(tmp_path / "clips")
    assert rep.records == 6 and rep.audio["codings"] == {"wav PCM_16": 6}
    s = convert(tmp_path / "clips", tmp_path / "back", to="audio", sample_rate=8000, device="cpu")
    assert s.records_out == 6 and sf.info(str(next((tmp_path / "back").rglob("*.wav")))).samplerate == 8000


def test_a_silent_tail_gives_the_features_a_full_transform_gives(monkeypatch):
    """Frames of a zero-padded tail are not transformed on the CPU; their features are exactly those
    of transforming them."""
    from gpubatch.engine.ops import spectral as audio_ops

    x = np.concatenate([speechy(1.3), np.zeros(16000 * 2, np.float32)])
    for chain in ("log_mel(n_mels=80)", "mfcc(n_mfcc=13, n_mels=40)", "mel(n_mels=32)", "spectrogram()"):
        quick = _run(chain, x, 16000).samples
        monkeypatch.setattr(audio_ops, "sounding_frames", lambda x, n_fft, hop: 1 + x.shape[-1] // hop)
        full = _run(chain, x, 16000).samples
        monkeypatch.undo()
        assert quick.shape == full.shape and np.abs(quick - full).max() <= 1e-5 * max(1.0, np.abs(full).max()), chain
    assert audio_ops.sounding_frames(x[None], 400, 160) == (20800 + 200) // 160 + 1


def test_long_files_stream_in_blocks_with_the_whole_files_results(tmp_path, monkeypatch):
    """A record above the streaming bound goes through mono, resample, gain, a cut and a feature op a
    block at a time: the same output as the whole file, with memory that follows the output."""
    import tracemalloc

    from gpubatch.engine.codecs import audio_stream
    from gpubatch.engine.codecs.audio import AudioHostCodec, decode_audio, probe_audio
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain
    from gpubatch.synthetic import speech_like

    x = np.stack([speech_like(np.random.default_rng(s), 60.0, 44100) for s in (1, 2)], 1)
    path = write(tmp_path / "long" / "talk.flac", x, 44100)
    data = path.read_bytes()
    info = probe_audio(data)
    monkeypatch.setattr(audio_stream, "STREAM_SAMPLES", 1 << 20)
    monkeypatch.setattr(audio_stream, "BLOCK", 1 << 15)
    codec = AudioHostCodec()
    for chain in ("mono() | resample(rate=16000) | log_mel(n_mels=80)",
                  "resample(rate=16000) | gain(db=-3) | fix_duration(seconds=20) | mfcc(n_mfcc=13, n_mels=40)",
                  "mono() | resample(rate=8000)"):
        plan = Plan(ops=parse_chain(chain), media="audio", max_pixels=0)
        item = codec.decode(type("R", (), {"data": data, "key": "k", "origin": "o", "codec": "flac",
                                           "_audio_info": info})(), plan)
        assert isinstance(item, audio_stream.AudioStream), chain
        params = plan.draw("k", *item.size)
        tracemalloc.start()
        got = codec.run_chain(plan.ops, item, params)
        streamed_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        tracemalloc.start()
        whole = codec.run_chain(plan.ops, decode_audio(data, info), params)
        whole_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got.samples.shape == whole.samples.shape and got.rate == whole.rate, chain
        assert np.abs(got.samples - whole.samples).max() <= 1e-4 * max(1.0, np.abs(whole.samples).max()), chain
        assert streamed_peak < whole_peak / 2, (chain, streamed_peak, whole_peak)
    assert not audio_stream.streamable(parse_chain("time_shift(seconds=1)"), info)
    assert not audio_stream.streamable(parse_chain("fix_duration(seconds=1) | resample(rate=8000)"), info)
    s = convert(tmp_path / "long", tmp_path / "o", to="audio", sample_rate=16000, mono=True, device="cpu")
    assert s.records_out == 1 and sf.info(str(next((tmp_path / "o").rglob("*.flac")))).frames == 960000


def test_mel_against_torchaudio_and_librosa_where_installed():
    """Where torchaudio or librosa is installed: the mel power spectrogram against theirs (Slaney scale
    and norm), and Whisper's log-mel built on torchaudio's."""
    x = speechy(2.0)
    ours = _run("mel(n_mels=80)", x, 16000).samples[0].astype(np.float64)
    checked = []
    try:
        import torch
        import torchaudio
    except Exception:  # noqa: BLE001 - not installed here
        pass
    else:
        mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, hop_length=160, n_mels=80, power=2.0,
                                                   norm="slaney", mel_scale="slaney", center=True, pad_mode="reflect")
        ref = mel(torch.from_numpy(x)).numpy().astype(np.float64)
        assert np.abs(ours - ref).max() <= 1e-4 * ref.max()
        log = np.log10(np.maximum(ref[:, :-1], 1e-10))
        log = (np.maximum(log, log.max() - 8) + 4) / 4
        assert np.abs(_run("log_mel(n_mels=80)", x, 16000).samples[0] - log).max() <= 1e-3
        checked.append("torchaudio")
    try:
        import librosa
    except Exception:  # noqa: BLE001
        pass
    else:
        ref = librosa.feature.melspectrogram(y=x, sr=16000, n_fft=400, hop_length=160, n_mels=80, pad_mode="reflect")
        assert np.abs(ours - ref).max() <= 1e-4 * ref.max()
        checked.append("librosa")
    if not checked:
        pytest.skip("neither torchaudio nor librosa is installed (the NumPy references above still run)")


@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord", "lmdb"])
def test_features_datasets_read_back_and_describe_themselves(tmp_path, fmt):
    root = speech_commands(tmp_path / "sc")
    convert(root, tmp_path / "feat", to=fmt, features="log-mel(n_mels=64)", duration=0.5, device="cpu")
    rep = info(tmp_path / "feat")
    assert rep.records == 6 and not rep.unreadable
    # (Caffe Datums carry no metadata: an LMDB's arrays take the kind gpubatch.json gives them all)
    assert rep.audio["features"] == {"log_mel 64x50 float16": 6}
    s = convert(tmp_path / "feat", tmp_path / "again", to="webdataset")  # passed through as they are
    assert s.records_out == 6 and s.passthrough == 6


def test_a_gpu_run_streams_long_records_on_the_cpu(tmp_path, monkeypatch):
    """The GPU run's preparation (host code, run here without a GPU) hands a long record whose chain
    streams to the CPU's block-at-a-time path, whole outputs, counted; a short one goes on to a batch."""
    from gpubatch.engine.codecs import audio_stream
    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.gpu import audio_records
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain
    from gpubatch.errors import RunStats
    from gpubatch.types import Media, Record

    monkeypatch.setattr(audio_stream, "STREAM_SAMPLES", 1 << 16)
    plan = Plan(ops=parse_chain("mono() | resample(rate=8000) | log_mel(n_mels=40)"), media="audio", max_pixels=0)
    long = Record(key="long", data=encoded(tone(6.0, 16000), 16000, "flac"), media=Media.AUDIO, codec="flac", origin="o")
    short = Record(key="short", data=encoded(tone(1.0, 16000), 16000, "flac"), media=Media.AUDIO, codec="flac", origin="o")
    stats = RunStats()
    (out,) = audio_records._prepare(long, plan, stats)
    assert isinstance(out, Record) and out.codec == "npy" and np.load(io.BytesIO(out.data)).shape == (40, 300)
    assert stats.fallbacks == 1
    ((job, item),) = audio_records._prepare(short, plan, stats)
    assert isinstance(item, AudioData) and item.samples.shape == (1, 16000) and stats.fallbacks == 1


def test_the_command_line_keeps_freed_memory_and_the_library_does_not():
    import platform
    import subprocess
    import sys

    from gpubatch.engine.processes import keep_freed_memory

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")  # mallopt took both settings
    code = ("import gpubatch, sys; import gpubatch.engine.processes as p; called = []; "
            "p.keep_freed_memory = lambda: called.append(1) or True; gpubatch.convert; print(len(called))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "0"  # importing and using the API does not touch the allocator


def test_the_largest_record_is_found_as_the_chain_decodes_it(tmp_path):
    """--gpu-memory sizes audio batches by the largest record of a sample: samples x channels as the
    chain decodes it (a leading fix_duration reads only that far), bad files passed over."""
    from gpubatch import open_dataset
    from gpubatch.engine.gpu.audio import largest_record
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    write(tmp_path / "a.wav", tone(1.0), 16000)
    write(tmp_path / "b.flac", tone(3.0, 8000, channels=2), 8000)
    (tmp_path / "c.wav").write_bytes(b"RIFF" + bytes(40))

    def plan(chain: str) -> Plan:
        return Plan(ops=tuple(parse_chain(chain)), media="audio", max_pixels=0)

    with open_dataset(tmp_path) as reader:
        entries = reader.entries()
        assert largest_record(reader, entries, plan("log_mel(n_mels=40)")) == (8000, 24000, 2)
        assert largest_record(reader, entries, plan("fix_duration(seconds=2) | log_mel(n_mels=40)")) == (8000, 16000, 2)


def test_a_decoding_worker_that_dies_is_an_error_not_a_hang(tmp_path):
    from gpubatch.engine.gpu.audio_feed import DecodeWorkers

    workers = DecodeWorkers(1)
    try:
        workers.procs[0].kill()
        task = workers.submit(("no-such-slab", "feed", 1 << 16, [], None, 0))
        with pytest.raises(RuntimeError, match="audio decoding worker ended"):
            workers.result(task)
    finally:
        workers.close()


def test_decoding_workers_end_on_their_own_after_a_feed_stopped_with_large_results_in_flight(tmp_path):
    """A feed stopped early whose tasks in flight carry large results (files too big for a slab, in bytes of their
    own; the GPU FLAC path's frames): closing the workers reads those results and drops them, so every worker
    ends on its own (exit code 0), none blocked on a full pipe until it is terminated."""
    import os

    from gpubatch.engine.gpu.audio_feed import DecodeWorkers, SharedFeed

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    big = write(tmp_path / "big.flac", (np.random.default_rng(3).uniform(-1, 1, (200000, 2)) * 0.5).astype(np.float32),
                16000)
    workers = DecodeWorkers(2)
    procs = list(workers.procs)
    try:
        feed = SharedFeed(workers, slabs=4, per_task=2, slab_bytes=1 << 16)
        items = feed.items(iter((str(big), f"k{i}") for i in range(64)), None)
        next(items)
        items.close()  # stopped with tasks in flight, each result 2 x 1.6 MB of samples
        feed.close()
    finally:
        workers.close()
    assert [p.exitcode for p in procs] == [0, 0]


def test_decoding_workers_serve_a_second_feed_after_one_stopped_early(tmp_path):
    """A feed left early forgets its tasks in flight (their results are dropped when they come); the
    same workers then serve a new feed, with slabs of their own, every file as decoded."""
    from gpubatch.engine.codecs.audio import decode_audio
    from gpubatch.engine.gpu.audio_feed import DecodeWorkers, SharedFeed

    files = [write(tmp_path / f"m{i}.flac", tone(0.1 + 0.02 * i), 16000) for i in range(12)]
    workers = DecodeWorkers(2)
    try:
        first = SharedFeed(workers, slabs=3, per_task=2, slab_bytes=1 << 16)
        items = first.items(iter((str(f), f.stem) for f in files), None)
        next(items)
        items.close()  # stopped with tasks in flight
        first.close()
        second = SharedFeed(workers, slabs=3, per_task=2, slab_bytes=1 << 16)
        got = {}
        for key, item, where in second.items(iter((str(f), f.stem) for f in files), None):
            got[key] = np.array(item.samples)
            second.release(where[0] if where else None)
        second.close()
    finally:
        workers.close()
    assert sorted(got) == sorted(f.stem for f in files)
    for f in files:
        assert np.array_equal(got[f.stem], decode_audio(str(f)).samples), f.stem


def test_a_feed_s_slabs_leave_dev_shm_as_soon_as_every_worker_maps_them(tmp_path):
    """The slabs' names go from /dev/shm once the workers hold them (a run killed with its process group
    took the resource tracker along, and each 16 MiB slab stayed until the machine restarted); the
    workers still decode into them, feed after feed."""
    from gpubatch.engine.codecs.audio import decode_audio
    from gpubatch.engine.gpu.audio_feed import DecodeWorkers, SharedFeed

    files = [write(tmp_path / f"m{i}.flac", tone(0.1 + 0.02 * i), 16000) for i in range(6)]
    workers = DecodeWorkers(2)
    try:
        for _ in range(2):
            feed = SharedFeed(workers, slabs=3, per_task=2, slab_bytes=1 << 16)
            try:
                assert feed.shms and not any(Path("/dev/shm", shm.name.lstrip("/")).exists() for shm in feed.shms)
                got = {}
                for key, item, where in feed.items(iter((str(f), f.stem) for f in files), None):
                    assert where is not None  # (in a slab)
                    got[key] = np.array(item.samples)
                    feed.release(where[0])
            finally:
                feed.close()
            assert all(np.array_equal(got[f.stem], decode_audio(str(f)).samples) for f in files)
    finally:
        workers.close()


def test_the_batched_window_is_what_crop_and_shift_do_record_by_record():
    """The device path's gather for time_crop and time_shift (run here with NumPy): records of any
    lengths, starts before, inside and past them, the same samples as the per-record host ops."""
    from gpubatch.engine.codecs.audio import AudioData
    from gpubatch.engine.ops.audio import TimeCrop, _crop, _shift, window_rows

    rng = np.random.default_rng(1)
    recs = [AudioData(rng.standard_normal((2, n)).astype(np.float32), 1000) for n in (700, 1500, 300, 1000)]
    op = TimeCrop(seconds=0.5)
    starts = [100, 0, 0, 499]
    got = window_rows([r.samples for r in recs], starts, 500, np)
    for r, s, g in zip(recs, starts, got):
        assert np.array_equal(g, _crop(op, r, s, np).samples)
    same = [AudioData(rng.standard_normal((2, 800)).astype(np.float32), 1000) for _ in range(4)]
    shifts = [120, -300, 799, -900]
    got = window_rows([r.samples for r in same], [-s for s in shifts], 800, np)
    for r, s, g in zip(same, shifts, got):
        assert np.array_equal(g, _shift(r, s, np).samples)


@pytest.mark.parametrize("prestarted,packed", [(False, False), (True, False), (False, True)])
def test_a_gpu_run_decodes_its_records_in_processes_in_shard_order(tmp_path, prestarted, packed):
    """The GPU audio unit's feed (host code, run here without a GPU): the records of a worker's tasks read
    and decoded in processes of their own, each entry's outputs in order with its task's shard (made in
    task order, an empty task's too), what the processes counted added to that shard's stats; a corrupt
    record comes back as its error in its place; a batch never spans two shards. The same from processes a
    worker's boot forked before its run came (``prestarted``: ``gpu.feed_start``, kind "audio"), each given
    the run's reader and plan as its first task. With the GPU's FLAC decoder (``packed``, the default) the
    processes only place each record's frames: its bytes come back (through shared memory or the pipe), and
    decoded they are libsndfile's samples."""
    import functools
    import os
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.execute.worker import RunContext
    from gpubatch.engine.gpu.audio_records import (
        _SHM_PREFIX,
        SHM_DIR,
        RecordDecoders,
        batched,
        sweep_shared,
    )
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain
    from gpubatch.errors import RecordError, RunStats
    from gpubatch.formats import open_reader
    from gpubatch.types import ShardTask

    src = tmp_path / "src"
    src.mkdir()
    for i in range(9):
        write(src / f"c{i}.flac", tone(0.25 + 0.05 * i, 16000), 16000)
    (src / "c9.flac").write_bytes(b"fLaC but not really")
    entries = open_reader(src).entries()
    plan = Plan(ops=parse_chain("mono() | log_mel(n_mels=40)"), media="audio", max_pixels=0)
    spans = [(0, 4), (4, 4), (4, 10)]
    tasks = [ShardTask(k, a, b, f"s{k}", tuple(entries[a:b])) for k, (a, b) in enumerate(spans)]
    from gpubatch.engine.codecs.flac_gpu import FlacPacked, decode_host
    from gpubatch.engine.settings import Settings

    ctx = RunContext(opener=functools.partial(open_reader, src), sink=None, plan=plan, device=Device(DeviceKind.CPU),
                     settings=Settings(flac_gpu=packed))
    made = []

    def make(task):
        made.append(SimpleNamespace(task=task, stats=RunStats()))
        return made[-1]

    def shm_left() -> list[str]:
        return [n for n in (os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else [])
                if n.startswith(f"{_SHM_PREFIX}{os.getpid()}-")]

    from gpubatch.engine.gpu import feed_start

    if prestarted:
        feed_start.prestart(3, "audio")  # (more than the run asks for: the third only waits)
    decoders = RecordDecoders(ctx, 2, chunk=3)
    assert decoders.prestarted == prestarted and not feed_start._PRESTARTED
    try:
        got = list(decoders.outputs(tasks, make))
        def kind(a):
            return f"FlacPacked/{type(a.samples.data).__name__}" if isinstance(a.samples, FlacPacked) else \
                type(a.samples).__name__

        kinds = {kind(o[1]) for _, outs, _ in got for o in outs if isinstance(o, tuple)}
        outs = [o for _, outs, _ in got for o in outs]
        # (the samples left in their shared file read, as the unit's staging reads them)
        outs = [(o[0], decoders.files.read(o[1])) if isinstance(o, tuple) and kind(o[1]) in ("Shared", "FlacPacked/Shared")
                else o for o in outs]
        if packed:  # (placed, not decoded: decoded here as the CPU path decodes a record the GPU refuses)
            assert all(isinstance(o[1].samples, FlacPacked) and isinstance(o[1].samples.data, np.ndarray)
                       for o in outs[:9])
            outs = [(o[0], decode_host(o[1])) if isinstance(o, tuple) else o for o in outs]
    finally:
        decoders.close()
    assert not shm_left()
    assert [s.task.index for s in made] == [0, 1, 2]
    assert [(s.task.index, last) for s, _, last in got] == [(0, False)] * 3 + [(0, True), (1, True)] + \
        [(2, False)] * 5 + [(2, True)]
    assert [o[0].template.key for o in outs[:9]] == [f"c{i}" for i in range(9)]
    assert all(isinstance(a, AudioData) and a.samples.shape == (1, int((0.25 + 0.05 * i) * 16000))
               for i, (_, a) in enumerate(outs[:9]))
    for i, (_, a) in enumerate(outs[:9]):  # (the samples the processes decoded, through shared memory or the pipe)
        assert np.array_equal(a.samples, sf.read(src / f"c{i}.flac", dtype="float32")[0][None])
    if os.path.isdir(SHM_DIR):  # (calls of 64 KB of samples and more through shared memory, the others pickled)
        if packed:  # (these short clips' bytes are below 64 KB a call: test_flac_gpu.py shares larger ones)
            assert kinds == {"FlacPacked/ndarray"}
        else:
            assert kinds == {"Shared", "ndarray"}
    a = outs[0][1].samples
    a[0, 0] += 1.0  # (writable, as an array of its own is)
    assert isinstance(outs[9], RecordError) and outs[9].key == "c9" and "decode" in str(outs[9])
    assert [s.stats.records_in for s in made] == [4, 0, 6]
    assert made[0].stats.timings["decode (processes)"] > 0
    # a run that stops early leaves no shared file behind; nor does one killed, once the next run starts and
    # its files are older than any live run's
    decoders = RecordDecoders(ctx, 2, chunk=3)
    outputs = decoders.outputs(tasks, lambda task: SimpleNamespace(task=task, stats=RunStats()))
    next(outputs)
    outputs.close()
    decoders.close()
    assert not shm_left()
    if os.path.isdir(SHM_DIR):
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        dead, young, alive = (Path(SHM_DIR) / f"{_SHM_PREFIX}{p}-1-{k}"
                              for k, p in enumerate((int(gone.stdout), int(gone.stdout), os.getpid())))
        for f in (dead, young, alive):
            f.write_bytes(b"x")
        hour_ago = time.time() - 3600
        os.utime(dead, (hour_ago, hour_ago))
        os.utime(alive, (hour_ago, hour_ago))
        sweep_shared()  # (a young file is a live run's, whatever its process looks like from here)
        assert not dead.exists() and young.exists() and alive.exists()
        young.unlink()
        alive.unlink()
    # batches of 2 jobs at most, each of one shard
    groups = list(batched(iter(got), 2))
    assert [[s.task.index for s, _, _ in g] for g in groups] == [[0, 0], [0, 0], [1], [2, 2], [2, 2], [2, 2]]
    # each group handed to the shards' writer in one go a shard, its entries' outputs in order, the shard's
    # last entry still its last
    from gpubatch.engine.gpu.audio import by_shard

    handed = [by_shard(g) for g in batched(iter(got), 4)]
    assert [[(s.task.index, len(outs), last) for s, outs, last in h] for h in handed] == \
        [[(0, 4, True)], [(1, 0, True)], [(2, 4, False)], [(2, 2, True)]]
    assert [o for h in handed for _, outs, _ in h for o in outs] == [o for _, outs, _ in got for o in outs]


def _encode_in_a_process(items):
    """The GPU audio unit's hand-over to a shard writer process, as it runs there: the outputs encoded."""
    from gpubatch.engine.gpu.audio import _encoded_timed
    from gpubatch.engine.plan import Plan
    from gpubatch.errors import RunStats

    stats = RunStats()
    out = _encoded_timed(items, Plan(), stats)
    return [(r.key, bytes(r.data), r.meta.get("features")) if hasattr(r, "data") else str(r) for r in out], \
        stats.timings["encode"] > 0


def test_features_go_to_a_writer_process_through_a_shared_file(tmp_path, monkeypatch):
    """The GPU audio unit with a shard writer process: a shard's features written into one shared file
    (share_items; its name kept), encoded there as encoding them here does (records and errors among them
    unchanged, an output the CPU failed on too as its error), the file's name removed as it is taken;
    unlink_shared removes the names of files never taken."""
    import multiprocessing as mp
    import os

    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.gpu import audio_records as ar
    from gpubatch.engine.gpu.audio import _encoded_timed
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.run import Job
    from gpubatch.errors import RecordError, RunStats, Stage
    from gpubatch.types import Media, Record

    monkeypatch.setattr(ar, "SHM_DIR", str(tmp_path))
    rng = np.random.default_rng(5)
    feats = rng.standard_normal((80, 3000)).astype(np.float16)  # (a Whisper clip's log-mel)

    def job(k):
        return Job(0, Record(key=f"c{k}", data=b"", media=Media.AUDIO, codec="flac"))

    items = [(job(0), AudioData(feats, 16000, features="log-mel")), ("a record passed through"),
             (job(1), RecordError("c1", "c1.flac", Stage.TRANSFORM, "the CPU failed too")),
             (job(2), AudioData(feats[::-1].copy(), 16000, features="log-mel"))]
    names: set[str] = set()
    shared = ar.share_items(items, names)
    assert len(names) == 1 and os.listdir(tmp_path) == list(names)
    assert shared[1] == items[1] and shared[2] is items[2] and isinstance(shared[0][1].samples, ar.Shared)
    want = [(r.key, bytes(r.data), r.meta.get("features")) if hasattr(r, "data") else str(r)
            for r in _encoded_timed(items, Plan(), RunStats())]
    with mp.get_context("spawn").Pool(1, initializer=_point_shm_at, initargs=(str(tmp_path),)) as pool:
        got, timed = pool.apply(_encode_in_a_process, (shared,))
    assert got == want and timed and not os.listdir(tmp_path)
    ar.share_items(items, names)
    assert len(os.listdir(tmp_path)) == 1
    ar.unlink_shared(names)
    assert not os.listdir(tmp_path) and not names


def test_a_batch_is_staged_from_the_shared_files_its_samples_lie_in(tmp_path, monkeypatch):
    """PinnedGather.stage (the GPU audio unit's, here with plain memory for its page-locked slots): a batch's
    samples read from the shared files their decoding calls wrote (one output of two sharing a decoding
    read twice, a stereo record in its shape, a float64 one cast) or copied from arrays of their own, into
    one slot back to back; the host items are views of it; each file's name goes as it is first read and
    the file once its last record is; a batch too large for a slot is read into arrays of their own; what
    was taken and never read goes at close; a slot is taken again once released."""
    import os

    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.gpu import audio_feed
    from gpubatch.engine.gpu import audio_records as ar

    monkeypatch.setattr(ar, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(audio_feed.PinnedGather, "_buffer", lambda self, n: bytearray(n))
    rng = np.random.default_rng(11)
    a = AudioData(rng.standard_normal((1, 20000)).astype(np.float32), 16000)
    b = AudioData(rng.standard_normal((2, 9000)).astype(np.float32), 44100)
    c = AudioData(rng.standard_normal((1, 7000)), 8000)  # (float64)
    own = AudioData(rng.standard_normal((1, 300)).astype(np.float32), 16000)
    files = ar.SharedFiles()

    def decoded():
        got = ar._share([([("j0", a), ("j1", a), ("j2", b)], {}), ([("j3", c)], {})])
        files.taken(got)
        return [o for outs, _ in got for o in outs]

    outs = decoded()
    assert {type(o[1].samples) for o in outs} == {ar.Shared} and len(os.listdir(tmp_path)) == 1
    gather = audio_feed.PinnedGather(0, slots=1)
    st = gather.stage([o[1] for o in outs] + [own], files)
    assert not os.listdir(tmp_path) and not files.files  # (read, its name gone and the file closed)
    for got, want in zip(st.hosts, [a, a, b, c, own]):
        assert got.rate == want.rate and np.array_equal(got.samples, np.asarray(want.samples, np.float32))
    flat = np.frombuffer(gather.host[0][0], np.float32)
    assert np.shares_memory(st.hosts[2].samples, flat) and st.spans[-1][1] == 2 * 20000 + 18000 + 7000 + 300
    # a slot is taken again once released
    st.release()
    outs = decoded()
    monkeypatch.setattr(audio_feed, "STAGE_MAX", 1000)
    big = gather.stage([o[1] for o in outs], files)
    assert big.slot is None and not os.listdir(tmp_path)
    assert np.array_equal(big.hosts[2].samples, b.samples) and not np.shares_memory(big.hosts[2].samples, flat)
    monkeypatch.undo()
    monkeypatch.setattr(ar, "SHM_DIR", str(tmp_path))
    decoded()
    files.close()
    assert not os.listdir(tmp_path) and not files.files


def test_a_batch_the_gpu_fails_on_runs_on_the_cpu_into_arrays_of_its_own():
    """run_on_gpu where the GPU fails (here: its upload raises): each job's chain runs on the CPU, counted,
    and an output that would be a view of its input (a chain that keeps or cuts the samples) is a copy: the
    input is a staging slot's, filled again once the batch is done."""
    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.gpu.audio import run_on_gpu
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.run import Job
    from gpubatch.engine.spec import parse_chain
    from gpubatch.errors import RunStats
    from gpubatch.types import Media, Record

    slot = np.arange(40000, dtype=np.float32) / 40000
    plan = Plan(ops=parse_chain("mono()"), media="audio", max_pixels=0)  # (a mono record as it is)
    items = [AudioData(slot[:20000].reshape(1, -1), 16000), AudioData(slot[20000:].reshape(1, -1), 8000)]
    jobs = [(Job(0, Record(key=f"k{i}", data=b"", media=Media.AUDIO, codec="flac"),
                 params=plan.draw(f"k{i}", it.rate, it.samples.shape[1])), it) for i, it in enumerate(items)]
    stats = [RunStats(), RunStats()]

    def fails(_items):
        raise RuntimeError("no GPU here")

    got, into = run_on_gpu(jobs, plan, stats, fails)
    assert into is None  # (arrays of their own)
    assert [s.fallbacks for s in stats] == [1, 1] and [s.transcoded for s in stats] == [1, 1]
    assert np.array_equal(got[0].samples, slot[None, :20000]) and np.array_equal(got[1].samples, slot[None, 20000:])
    assert not any(np.may_share_memory(g.samples, slot) for g in got)


def _point_shm_at(path):
    from gpubatch.engine.gpu import audio_records as ar

    ar.SHM_DIR = path


def test_decoded_samples_go_through_a_shared_file_or_the_pipe_where_it_cannot_be_made(tmp_path, monkeypatch):
    """A decoding call's samples (64 KB and more) written into one file and taken back as views of it, its
    name removed as it is read; a record's outputs that share one decoding share its samples' place; where the file
    cannot be made (no folder, a short write: a full /dev/shm) the result is left as it was (the pipe)."""
    import os

    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.gpu import audio_records as ar

    rng = np.random.default_rng(3)
    a = AudioData(rng.standard_normal((1, 16000)).astype(np.float32), 16000)
    b = AudioData(rng.standard_normal((16000, 2)).astype(np.float32).T, 44100)  # (not contiguous)
    out = [([("job0", a), ("job1", a), "a record passed through"], {"counts": {}}), ([("job2", b)], {"counts": {}})]
    monkeypatch.setattr(ar, "SHM_DIR", str(tmp_path))
    shared = ar._share(out)
    (name,) = os.listdir(tmp_path)
    assert shared[0][0][0][1].samples.name == name and shared[0][0][2] == "a record passed through"
    assert shared[0][0][0][1] is shared[0][0][1][1]  # (the outputs of one decoding: its samples written once)
    files = ar.SharedFiles()
    files.taken(shared)
    back = [[files.read(o[1]) if isinstance(o, tuple) else o for o in outs] for outs, _ in shared]
    assert not os.listdir(tmp_path) and not files.files
    got_a, got_a2, got_b = back[0][0], back[0][1], back[1][0]
    assert np.array_equal(got_a.samples, a.samples) and np.array_equal(got_a2.samples, a.samples) and got_a.rate == 16000
    assert np.array_equal(got_b.samples, b.samples) and got_b.rate == 44100

    small = [([("job", AudioData(np.zeros((1, 100), np.float32), 16000))], {})]
    assert ar._share(small) is small  # (below SHARE_FROM: pickled)
    monkeypatch.setattr(ar, "SHM_DIR", str(tmp_path / "missing"))
    assert ar._share(out) is out
    monkeypatch.setattr(ar, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: len(data) // 2)
    assert ar._share(out) is out and not os.listdir(tmp_path)


def test_a_download_slot_is_free_again_once_every_holder_released_it():
    """The GPU audio unit's page-locked slots (audio_chain.Download, its memory here a bytearray): views of its
    bytes at an offset; free (back in its owner's queue) only when the loop's hold and each hand-over's are
    released, from whichever thread; or at once where its batch failed on its way in (give_back)."""
    import queue
    import threading
    from types import SimpleNamespace

    from gpubatch.engine.gpu.audio_chain import Download

    owner = SimpleNamespace(free=queue.Queue())
    slot = Download(owner, 4, bytearray(1024), 1024)
    view = slot.array(256, np.float16, 8)
    view[:] = 1.5
    assert bytes(slot.mem[256:258]) == np.float16(1.5).tobytes()
    slot.hold(1 + 3)
    threads = [threading.Thread(target=slot.release) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert owner.free.empty()  # (the loop's own hold)
    slot.release()
    assert owner.free.get_nowait() == 4 and owner.free.empty()
    slot.hold(2)  # (a batch that failed on its way into the slot: given back at once, whatever held it)
    slot.give_back()
    assert owner.free.get_nowait() == 4 and slot.holders == 0


def test_a_recording_too_short_for_a_log_mel_frame_is_its_error_in_words(tmp_path):
    """Whisper's log-mel drops its last frame, so a recording shorter than one hop (160 samples) has none: its reason
    had been NumPy's ("ValueError: zero-size array to reduction operation maximum which has no identity"), and on the
    GPU the whole batch failed on it and ran on the CPU. Now the op's size walk says it before any work, in words."""

    from gpubatch.engine.ops.spectral import MFCC, LogMel
    from gpubatch.errors import RecordCondition

    assert LogMel().out_hw(16000, 160) == (80, 1) and MFCC().out_hw(16000, 1) == (40, 1)
    with pytest.raises(RecordCondition, match="too short for log_mel: 159 samples at 16,000 Hz"):
        LogMel().out_hw(16000, 159)
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for n in (1, 100, 300, 320):
        sf.write(src / f"n{n}.wav", np.full((n,), 0.1), 16000)
    s = convert(tmp_path / "src", tmp_path / "out", to="webdataset", from_format="audio", sample_rate=8000,
                features="log-mel(n_mels=80)")
    assert s.records_out == 1 and sorted(e["key"] for e in s.skipped) == ["a/n1", "a/n100", "a/n300"], s.as_dict()
    assert all(e["reason"].startswith("too short for log_mel: ") for e in s.skipped), s.skipped
    assert "150 samples at 8,000 Hz" in next(e["reason"] for e in s.skipped if e["key"] == "a/n300")
