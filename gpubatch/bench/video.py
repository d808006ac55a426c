"""The video bench's contenders (``bench --model video-clf``), each run in its own process like the
image contenders (:mod:`.contenders` dispatches here for a video model):

- ``gpubatch-gpu`` / ``gpubatch-cpu``: :class:`~gpubatch.pipelines.video.VideoPipeline` on the GPU
  (NVDEC sessions in threads) / on every core (PyAV in worker processes).
- ``pyav-dataloader``: a PyTorch DataLoader, one worker per core, each clip decoded with PyAV from the
  keyframe before its first frame (as torchvision's ``read_video`` does) and transformed with torch:
  the short side resized with antialiasing, a random crop, a flip, normalized fp16 (C, T, H, W).
- ``dali``: NVIDIA DALI's ``readers.video`` (NVDEC) with its own GPU ops, the same chain: sequences of
  16 frames at the model's frame step, shuffled, the short side resized to 256 (antialiased), a random
  224 crop, a flip, normalized fp16 C,F,H,W; when ``nvidia.dali`` imports. Where the legacy reader
  refuses the set (mixed resolutions), ``experimental.readers.video`` on the GPU is taken, and named.
- ``torchcodec``, ``decord``: not measured yet; the result says whether each imports here.

Clips/s is the median over 5 windows after a warm-up of one pass over the files; frames/s counts the
frames the clips hold (``frames_decoded_per_s``: every frame a decoder produced to reach them, seeks
included, where the contender can count them).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from .measure import Cycle, GpuSampler, media_files, timed_contender, warmup_batches


def run_gpubatch_video(a: dict, device: str) -> dict:
    from ..pipelines.video import VideoPipeline
    from . import chain_ops, get_model

    model = get_model(a["model"])
    T, step = model.clip
    files = media_files(a["data"], a["images"], "video")
    sampler = DecoderSampler(a.get("gpu", 0)) if device == "gpu" else None
    pipe = VideoPipeline(chain_ops(model.chains[a["chain"]]), clip_length=T, frame_step=step, device=device,
                         gpu=a.get("gpu", 0), seed=0)
    it = pipe.iterate_files(files, a["batch_size"], repeat=True)

    def step_() -> int:
        return len(next(it))

    res = timed_contender(step_, a, sampler=sampler)
    it.close()
    pipe.close()
    res.update(_video_rates(res, T))
    if device == "gpu":  # every frame NVDEC produced to reach the clips' frames, per clip over the whole run
        res["frames_decoded_per_clip"] = pipe.stats["frames_decoded"] / max(pipe.stats["clips"], 1)
        res["frames_decoded_per_s"] = res["frames_decoded_per_clip"] * res["clips_per_s"]
        res["cpu_fallbacks"] = pipe.stats["cpu_fallbacks"]
        res["stages_s"] = {k: round(v, 3) for k, v in pipe.timings.items()}
        res.update(sampler.summary())
    else:
        res["stages_s"] = {"worker processes (read, decode, ops)": round(res["seconds"], 3)}
    res["workers"] = pipe.decoders if device == "gpu" else pipe.workers
    res["files_without_clip"] = dict(list(pipe.skipped.items())[:5], total=len(pipe.skipped)) if pipe.skipped else {}
    return res


def _video_rates(res: dict, T: int) -> dict:
    return {"clips_per_s": res["images_per_s"], "frames_per_s": res["images_per_s"] * T, "unit": "clips"}


class DecoderSampler(GpuSampler):
    """GPU memory and utilisation (:class:`GpuSampler`) and NVDEC utilisation (NVML's decoder utilisation)."""

    def __init__(self, index: int = 0):
        self.dec: list[int] = []
        super().__init__(index)

    def sampled(self) -> None:
        super().sampled()
        if self.measuring:
            try:
                self.dec.append(self.nvml.nvmlDeviceGetDecoderUtilization(self.handle)[0])
            except Exception:  # noqa: BLE001 - an NVML without it
                pass

    def summary(self) -> dict:
        out = super().summary()
        out["nvdec_util_pct"] = sum(self.dec) / len(self.dec) if self.dec else None
        return out


class _Clips:
    """A torch Dataset of clips decoded with PyAV (the DataLoader contender's)."""

    def __init__(self, files: list[Path], T: int, step: int, short: int, crop: int):
        self.files, self.T, self.step, self.short, self.crop = files, T, step, short, crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import av
        import numpy as np
        import torch
        import torch.nn.functional as F

        span = 1 + (self.T - 1) * self.step
        with av.open(str(self.files[i])) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            n = s.frames or int(float(s.duration * s.time_base) * float(s.average_rate))
            start = random.randint(0, max(n - span, 0))
            rate = float(s.average_rate)
            t0 = int(start / rate / float(s.time_base))
            c.seek(t0, stream=s, backward=True, any_frame=False)
            frames = []
            for f in c.decode(s):
                k = int(round(float(f.pts * s.time_base) * rate)) if f.pts is not None else start
                if k < start:
                    continue
                if (k - start) % self.step == 0:
                    frames.append(f.to_ndarray(format="rgb24"))
                if len(frames) == self.T or k >= start + span:
                    break
        while len(frames) < self.T:  # a clip cut short by the end of the file: its last frame repeated
            frames.append(frames[-1])
        x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()  # T, C, H, W
        h, w = x.shape[-2:]
        scale = self.short / min(h, w)
        x = F.interpolate(x, size=(round(h * scale), round(w * scale)), mode="bilinear", antialias=True,
                          align_corners=False)
        y0 = random.randint(0, x.shape[-2] - self.crop)
        x0 = random.randint(0, x.shape[-1] - self.crop)
        x = x[..., y0: y0 + self.crop, x0: x0 + self.crop]
        if random.random() < 0.5:
            x = x.flip(-1)
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
        return ((x - mean) / std).half().permute(1, 0, 2, 3).contiguous()  # C, T, H, W


def run_pyav_dataloader(a: dict) -> dict:
    try:
        import av  # noqa: F401
        import torch
    except ImportError as e:
        return {"skipped": f"torch or PyAV not importable: {e}"}
    from . import get_model

    model = get_model(a["model"])
    T, step = model.clip
    files = media_files(a["data"], a["images"], "video")
    workers = os.cpu_count() or 1
    dl = torch.utils.data.DataLoader(_Clips(files, T, step, 256, 224), batch_size=a["batch_size"],
                                     num_workers=workers, persistent_workers=True, prefetch_factor=2,
                                     sampler=Cycle(len(files), 10_000))
    it = iter(dl)

    def step_() -> int:
        return len(next(it))

    warm = max(warmup_batches(a), 2)
    res = timed_contender(step_, a, warmup=warm)
    res["workers"], res["warmup_batches"] = workers, warm
    res.update(_video_rates(res, T))
    return res


def dali_video_pipeline(a: dict, reader: str):
    """DALI's video-clf pipeline with ``reader`` (``readers.video`` or ``experimental.readers.video``),
    built; raises what DALI raises."""
    from nvidia.dali import fn, pipeline_def, types

    from . import get_model

    model = get_model(a["model"])
    T, step = model.clip
    files = [str(p) for p in media_files(a["data"], a["images"], "video")]

    @pipeline_def(batch_size=a["batch_size"], num_threads=os.cpu_count() or 4, device_id=a.get("gpu", 0), seed=0)
    def pipe():
        if reader == "readers.video":
            v = fn.readers.video(device="gpu", filenames=files, sequence_length=T, stride=step,
                                 random_shuffle=True, name="r")
        else:
            v = fn.experimental.readers.video(device="gpu", filenames=files, sequence_length=T, stride=step,
                                              random_shuffle=True, name="r")
        v = fn.resize(v, resize_shorter=256, antialias=True)
        return fn.crop_mirror_normalize(v, dtype=types.FLOAT16, output_layout="CFHW", crop=(224, 224),
                                        crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
                                        crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
                                        mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                        std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
                                        mirror=fn.random.coin_flip())

    p = pipe()
    p.build()
    p.run()  # a reader that refuses the set says so on its first batch
    return p


def _dali_reason(e: Exception) -> str:
    """The line of a DALI error that says why (its first lines only say where)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    why = [ln for ln in lines if "ssert" in ln or "failed" in ln or "not supported" in ln.lower()]
    return f"{type(e).__name__}: {(why or lines[-1:] or [''])[0][:240]}"


def run_dali_video(a: dict) -> dict:
    """DALI's clip chain (:func:`dali_video_pipeline`) timed as gpubatch's: a warm-up pass over the files
    untimed, then windows of ``Pipeline.run()``."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed (or broken): say so
        return {"skipped": f"nvidia.dali not importable: {e}"}
    from . import get_model

    T = get_model(a["model"]).clip[0]
    sampler = DecoderSampler(a.get("gpu", 0))  # before DALI touches CUDA
    refused = None
    try:
        pipe, reader = dali_video_pipeline(a, "readers.video"), "readers.video"
    except Exception as e:  # noqa: BLE001 - the legacy reader's limits (one resolution, CFR): the newer one
        refused = _dali_reason(e)
        try:
            pipe, reader = dali_video_pipeline(a, "experimental.readers.video"), "experimental.readers.video"
        except Exception as e2:  # noqa: BLE001
            sampler.summary()
            return {"error": f"DALI refused the clip set: {refused}; experimental reader: {_dali_reason(e2)}"}
    res = timed_contender(lambda: (pipe.run(), a["batch_size"])[1], a, sampler=sampler)
    res.update(sampler.summary())
    res.update(_video_rates(res, T))
    res["setting"] = reader + (f" (readers.video refused: {refused})" if refused else "")
    import nvidia.dali as dali

    res["dali_version"] = dali.__version__
    return res


def not_measured(name: str, module: str) -> dict:
    try:
        __import__(module)
    except Exception:  # noqa: BLE001 - not installed (or broken): say so
        return {"skipped": f"{module} is not installed here"}
    return {"skipped": f"{module} imports, but gpubatch's bench has no {name} video contender yet"}


VIDEO_CONTENDERS = ("gpubatch-gpu", "gpubatch-cpu", "pyav-dataloader", "dali", "torchcodec", "decord")


def run_video_contender(a: dict) -> dict:
    name = a["contender"]
    if name in ("gpubatch-gpu", "gpubatch-cpu"):
        return run_gpubatch_video(a, name.split("-")[1])
    if name == "pyav-dataloader":
        return run_pyav_dataloader(a)
    if name == "dali":
        return run_dali_video(a)
    if name in ("torchcodec", "decord"):
        return not_measured(name, name)
    return {"error": f"unknown video contender {name!r}"}
