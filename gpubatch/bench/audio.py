"""The audio bench's contenders (``bench --model whisper`` and ``--model audio-clf``), each run in its
own process like the image contenders (:mod:`.contenders` dispatches here for an audio model):

- ``gpubatch-gpu`` / ``gpubatch-cpu``: :class:`~gpubatch.pipelines.audio.AudioPipeline` on the GPU
  (decoding threads, the chain a batch at once) / on every core (worker processes, host kernels).
- ``torchaudio-dataloader``: a PyTorch DataLoader, one worker per core, each clip read with soundfile
  and run through the same chain in torch: ``torchaudio.functional.resample``,
  ``torchaudio.transforms.MelSpectrogram`` (Slaney scale and norm), Whisper's log, ``FrequencyMasking`` and
  ``TimeMasking``. Without torchaudio: ``torch.stft`` and the same Slaney filter bank (the computation
  MelSpectrogram does), soxr for resampling, named in the result's ``setting``.
- ``dali``: NVIDIA DALI's ``decoders.audio`` (resampling to 16 kHz, downmixed) + ``slice`` to the length
  + ``spectrogram`` + ``mel_filter_bank`` (Slaney) + ``to_decibels`` (log10) + Whisper's floor and scale,
  on the GPU, when ``nvidia.dali`` imports; DALI's spectrogram keeps the last frame Whisper drops, and
  SpecAugment's masks are left out of DALI's chain (named in the result).

Clips/s is the median over 5 windows after a warm-up of one pass over the files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .measure import Cycle, GpuSampler, media_files, timed_contender, warmup_batches

AUDIO_CONTENDERS = ("gpubatch-gpu", "gpubatch-cpu", "torchaudio-dataloader", "dali")


def _rates(res: dict) -> dict:
    return {"clips_per_s": res["images_per_s"], "unit": "clips"}


def _decode_files(paths: list[str]) -> int:
    """Decode ``paths`` whole into float32 with libsndfile, as the pipelines' workers do; the clips decoded
    (files libsndfile does not read are passed over)."""
    import soundfile as sf

    n = 0
    for p in paths:
        try:
            with sf.SoundFile(p) as f:
                f.read(f.frames, dtype="float32", always_2d=True)
        except Exception:  # noqa: BLE001 - not for libsndfile (m4a...): not part of this ceiling
            continue
        n += 1
    return n


def decode_ceiling(files: list[Path], seconds: float = 2.0) -> dict[str, Any]:
    """What the CPU allows any pipeline that decodes these files with libsndfile (gpubatch's, DALI's
    ``decoders.audio``): clips/s with every core decoding and doing nothing else (one process a core,
    passes over the files for about ``seconds``), and one core's milliseconds a clip."""
    import multiprocessing as mp
    import time

    paths = [str(f) for f in files]
    one = paths[: min(len(paths), 16)]
    _decode_files(one)  # (the page cache warm)
    t0 = time.perf_counter()
    decoded = _decode_files(one)
    if not decoded:
        return {"skipped": "libsndfile reads none of the first files"}
    per_clip = (time.perf_counter() - t0) / decoded
    cores = os.cpu_count() or 1
    passes = max(1, int(seconds * cores / max(per_clip, 1e-6) / len(paths)))
    work = [paths[i:: cores * 4] for i in range(cores * 4)] * passes
    with mp.get_context("spawn").Pool(cores) as pool:
        pool.map(_decode_files, [one[:2]] * cores)  # every process started
        t0 = time.perf_counter()
        done = sum(pool.map(_decode_files, [w for w in work if w]))
        elapsed = time.perf_counter() - t0
    return {"clips_per_s": round(done / elapsed), "ms_per_clip_one_core": round(per_clip * 1e3, 3), "cores": cores}


def run_gpubatch_audio(a: dict, device: str) -> dict:
    from ..pipelines.audio import AudioPipeline
    from . import chain_ops, get_model

    model = get_model(a["model"])
    files = media_files(a["data"], a["images"], "audio")
    sampler = GpuSampler(a.get("gpu", 0)) if device == "gpu" else None
    pipe = AudioPipeline(chain_ops(model.chains[a["chain"]]), device=device, gpu=a.get("gpu", 0), seed=0)
    it = pipe.iterate_files(files, a["batch_size"], repeat=True)

    def step() -> int:
        batch = next(it)
        batch.synchronize()  # a batch counts once computed (the next ones are launched meanwhile)
        return len(batch)

    res = timed_contender(step, a, sampler=sampler)
    it.close()
    pipe.close()
    res.update(_rates(res))
    res["workers"] = pipe.workers
    if sampler:
        t = pipe.timings
        res["stages_s"] = {"waiting for decoded files": round(t["decode"], 3), "upload": round(t["upload"], 3),
                           "GPU ops (launching)": round(t["ops"], 3)}
        res["setting"] = "decoding in worker processes, into shared memory" if pipe.feed == "processes" \
            else "decoding in threads"
        res.update(sampler.summary())
    else:
        res["stages_s"] = {"worker processes (read, decode, ops)": round(res["seconds"], 3)}
    if pipe.skipped:
        res["files_without_output"] = dict(list(pipe.skipped.items())[:5], total=len(pipe.skipped))
    return res


# --- the torch DataLoader ---------------------------------------------------------------------------------


class _TorchChain:
    """The model's chain in torch (torchaudio where installed), op by op."""

    def __init__(self, ops: tuple, torchaudio: Any):
        self.ops, self.ta = ops, torchaudio
        self._mel: dict = {}

    def mel(self, rate: int, op: Any) -> Any:
        import torch

        key = (rate, op.n_fft, op.hop, op.n_mels)
        if key not in self._mel:
            if self.ta is not None:
                self._mel[key] = self.ta.transforms.MelSpectrogram(
                    sample_rate=rate, n_fft=op.n_fft, hop_length=op.hop, n_mels=op.n_mels, power=2.0, norm="slaney",
                    mel_scale="slaney", center=True, pad_mode="reflect")
            else:
                from ..engine.ops.spectral import mel_filters

                fb = torch.from_numpy(mel_filters(rate, op.n_fft, op.n_mels))
                win = torch.hann_window(op.n_fft)

                def f(x: Any, fb: Any = fb, win: Any = win, op: Any = op) -> Any:
                    spec = torch.stft(x, op.n_fft, op.hop, window=win, center=True, pad_mode="reflect",
                                      return_complex=True).abs() ** 2
                    return fb @ spec

                self._mel[key] = f
        return self._mel[key]

    def __call__(self, x: Any, rate: int) -> Any:
        import random

        import torch

        for op in self.ops:
            if op.name == "resample":
                if rate == op.rate:
                    continue
                if self.ta is not None:
                    x = self.ta.functional.resample(x, rate, op.rate)
                else:
                    import soxr

                    x = torch.from_numpy(soxr.resample(x.numpy().T, rate, op.rate, quality="HQ").T.copy())
                rate = op.rate
            elif op.name == "fix_duration":
                n = int(round(op.seconds * rate))
                x = torch.nn.functional.pad(x[..., :n], (0, max(0, n - x.shape[-1])))
            elif op.name == "log_mel":
                m = self.mel(rate, op)(x)[..., :-1]
                m = torch.clamp(m, min=1e-10).log10()
                x = (torch.maximum(m, m.max() - 8.0) + 4.0) / 4.0
            elif op.name in ("freq_mask", "time_mask"):
                axis = -2 if op.name == "freq_mask" else -1
                for _ in range(op.count):
                    size = x.shape[axis]
                    w = random.randint(0, min(op.width, size))
                    s = random.randint(0, size - w)
                    if axis == -2:
                        x[..., s: s + w, :] = op.value
                    else:
                        x[..., s: s + w] = op.value
            elif op.name == "mono":
                x = x.mean(0, keepdim=True)
            else:
                raise ValueError(f"no torch version of {op.name}")
        return x


class _Clips:
    def __init__(self, files: list[Path], chain: _TorchChain):
        self.files, self.chain = files, chain

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import soundfile as sf
        import torch

        x, rate = sf.read(str(self.files[i]), dtype="float32", always_2d=True)
        x = torch.from_numpy(x.T.copy())
        if x.shape[0] > 1:
            x = x.mean(0, keepdim=True)
        return self.chain(x, rate)[0].half()


def run_torch_dataloader(a: dict) -> dict:
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"torch not importable: {e}"}
    try:
        import torchaudio
    except Exception:  # noqa: BLE001 - not installed: torch.stft and the same filter bank
        torchaudio = None
    from . import chain_ops, get_model

    model = get_model(a["model"])
    files = media_files(a["data"], a["images"], "audio")
    chain = _TorchChain(chain_ops(model.chains[a["chain"]]), torchaudio)
    workers = os.cpu_count() or 1
    torch.set_num_threads(1)
    dl = torch.utils.data.DataLoader(_Clips(files, chain), batch_size=a["batch_size"], num_workers=workers,
                                     persistent_workers=True, prefetch_factor=2, sampler=Cycle(len(files), 10_000))
    it = iter(dl)
    res = timed_contender(lambda: len(next(it)), a, warmup=max(warmup_batches(a), 2))
    res["workers"] = workers
    res["setting"] = (f"torchaudio {torchaudio.__version__}" if torchaudio is not None else
                      "torchaudio not installed: torch.stft + the Slaney filter bank, soxr resampling")
    res.update(_rates(res))
    return res


# --- DALI ----------------------------------------------------------------------------------------------


def run_dali_audio(a: dict) -> dict:
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali import math as dmath
    except Exception as e:  # noqa: BLE001 - not installed (or broken): say so
        return {"skipped": f"nvidia.dali not importable: {e}"}
    from . import chain_ops, get_model

    model = get_model(a["model"])
    ops = chain_ops(model.chains[a["chain"]])
    by = {op.name: op for op in ops}
    rate = by["resample"].rate if "resample" in by else 16000
    n = int(round(by["fix_duration"].seconds * rate))
    lm = by["log_mel"]
    files = [str(p) for p in media_files(a["data"], a["images"], "audio")]
    sampler = GpuSampler(a.get("gpu", 0))

    @pipeline_def(batch_size=a["batch_size"], num_threads=os.cpu_count() or 4, device_id=a.get("gpu", 0), seed=0)
    def pipe():
        enc, _ = fn.readers.file(files=files, name="r")
        audio, _ = fn.decoders.audio(enc, sample_rate=rate, downmix=True, dtype=types.FLOAT)
        audio = fn.slice(audio, 0, n, axes=[0], out_of_bounds_policy="pad")
        spec = fn.spectrogram(audio.gpu(), nfft=lm.n_fft, window_length=lm.n_fft, window_step=lm.hop,
                              center_windows=True, reflect_padding=True, power=2)
        mel = fn.mel_filter_bank(spec, sample_rate=rate, nfilter=lm.n_mels, normalize=True, mel_formula="slaney")
        db = fn.to_decibels(mel, multiplier=1.0, reference=1.0, cutoff_db=-10.0)  # log10, floored at 1e-10
        top = fn.reductions.max(db)
        out = (dmath.max(db, top - 8.0) + 4.0) / 4.0
        return fn.cast(out, dtype=types.FLOAT16)

    try:
        p = pipe()
        p.build()
    except Exception as e:  # noqa: BLE001
        sampler.summary()
        return {"error": f"DALI refused the pipeline: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"}
    res = timed_contender(lambda: (p.run(), a["batch_size"])[1], a, sampler=sampler)
    res.update(sampler.summary())
    res.update(_rates(res))
    left = [op.name for op in ops if op.name not in ("resample", "fix_duration", "log_mel")]
    res["setting"] = "decoders.audio + spectrogram + mel_filter_bank + to_decibels" + (
        f"; without {', '.join(left)} (no DALI op here)" if left else "")
    res["workers"] = os.cpu_count()
    return res


def run_audio_contender(a: dict) -> dict:
    name = a["contender"]
    if name in ("gpubatch-gpu", "gpubatch-cpu"):
        return run_gpubatch_audio(a, name.split("-")[1])
    if name == "torchaudio-dataloader":
        return run_torch_dataloader(a)
    if name == "dali":
        return run_dali_audio(a)
    return {"error": f"unknown audio contender {name!r}"}
