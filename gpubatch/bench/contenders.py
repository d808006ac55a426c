"""Bench contenders, each run in its own process: ``python -m gpubatch.bench.contenders '{json args}'``
prints one ``RESULT {json}`` line.

- ``gpubatch-gpu`` / ``gpubatch-cpu``: :class:`~gpubatch.pipelines.image.ImagePipeline` on the device /
  on every core (worker processes), reading the files from disk each batch in reader processes
  (``ImagePipeline.iterate_files``).
- ``torch-dataloader``: a PyTorch DataLoader, one worker per core, torchvision transforms on Pillow.
- ``dali``: NVIDIA DALI's file reader, mixed decoder and its own ops, when ``nvidia.dali`` imports, at
  the setting DALI measured fastest on mixed data (full decode, ``hw_decoder_load=0.9``);
  ``dali-defaults``: the same with DALI's defaults (region decode for the training chain).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import chain_ops, get_model
from .measure import CpuUse, Cycle, GpuSampler, bottleneck, timed_windows, warmup_batches


def data_files(data: str, n: int) -> list[Path]:
    files = sorted(p for p in Path(data).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    return files[:n] if n else files


def file_keys(files: list[Path]) -> list[str]:
    """The record key of each bench file ("class/stem"), as every contender and study draws by."""
    return [f"{p.parent.name}/{p.stem}" for p in files]


def _encode_one(arr: Any) -> int:
    from ..engine.codecs import image as host

    return len(host.encode(arr, "jpeg", 90))


def run_gpubatch(a: dict, device: str) -> dict:
    sampler = GpuSampler(a.get("gpu", 0)) if device == "gpu" else None
    from ..engine.settings import Settings
    from ..pipelines.image import ImagePipeline

    # the knobs a sweep or a study names, over the environment's
    settings = Settings.from_env(reserve_core=bool(a["reserve_core"]) if "reserve_core" in a else None)
    model = get_model(a["model"])
    ops = chain_ops(model.chains[a["chain"]])
    files = data_files(a["data"], a["images"])
    B = a["batch_size"]
    pipe = ImagePipeline(ops, device=device, seed=0, cpu_threads=a.get("threads"), gpu=a.get("gpu", 0),
                         warm_up=a.get("warm_up", 256), region_decode=bool(a.get("region_decode", 0)),
                         decode_chunk=int(a["decode_chunk"]) if "decode_chunk" in a else None, sync=a.get("sync"),
                         decode_route=a.get("decode_route"), gpu_memory=a.get("gpu_memory"), settings=settings)
    eng = pipe.engine
    if eng is not None and a.get("cuda_share") is not None:
        eng.decoder.cuda_share, eng.decoder.deterministic, eng.decoder.follower = float(a["cuda_share"]), True, None
    sync = eng.stream.synchronize if eng else (lambda: None)
    it = pipe.iterate_files(files, file_keys(files), B, repeat=True)
    enc = {"encode": 0.0}

    def step() -> int:
        out = next(it)
        n = len(out)
        if model.encode:
            t0 = time.perf_counter()
            if eng is not None:
                eng.encoder.encode(out.items(), "jpeg", 90, eng.stream)
            else:
                list(pipe._pool().map(_encode_one, out, chunksize=8))
            enc["encode"] += time.perf_counter() - t0
        return n

    cpu = CpuUse()
    if sampler:
        sampler.measuring = True
    res = timed_windows(step, a["seconds"], warmup=warmup_batches(a), sync=sync)
    res["cpu_cores_used"] = cpu.stop()
    res["host_cpu"] = cpu.host
    if eng is None:  # the worker processes read, decode and run the ops: one stage seen from here
        stages = {"workers (read, decode, ops)": pipe.timings["workers"]}
    else:
        stages = {"read_wait": pipe.timings["read_wait"], "decode": pipe.timings["decode"],
                  "ops" if ops else "copy-out": pipe.timings["ops"], "decode_wait": pipe.timings["decode_wait"]}
    if model.encode:
        stages["encode"] = enc["encode"]
    res["stages_s"] = {k: round(v, 3) for k, v in stages.items()}
    # the consumer's wait for decode counts for decode: the decoders' threads do the work it waits for
    res["bottleneck"] = bottleneck({"read": stages.get("read_wait", 0),
                                    "decode": stages.get("decode", 0) + stages.get("decode_wait", 0),
                                    "ops/copy-out": stages.get("ops", stages.get("copy-out", 0)),
                                    "worker processes": stages.get("workers (read, decode, ops)", 0),
                                    "encode": stages.get("encode", 0)})
    if eng is not None:
        res["hw_decoder_share"] = pipe.stats["hw"] / max(pipe.stats["gpu"], 1)
        # the route chosen at the start (the decoder's own may have followed the load since: switches)
        res["decode_route"] = {"route": eng.decode_route, "free_cores": eng.route_cores}
        if eng.decoder.follower is not None:  # the route as it followed the load (engine/follow.py)
            res["decode_route"]["switches"] = eng.decoder.follower.switches
            res["decode_route"]["batches"] = dict(eng.decoder.route_batches)
        res["cpu_fallbacks"] = pipe.stats["fallbacks"]
        if pipe.memory_plan is not None:
            mp = pipe.memory_plan
            res["gpu_memory_cap_mib"] = mp.cap >> 20
            res["setting"] = f"under a {mp.cap >> 20} MiB cap: {mp.describe()}"
        res["decoder_s"] = {k: round(v, 3) for k, v in eng.decoder.timings.items()}
    it.close()
    if sampler:
        res.update(sampler.summary())  # the pipeline's own memory and utilisation, before the extras below
    if device == "gpu" and a.get("fidelity", True):
        res["fidelity"] = fidelity(ops, files[:16], a.get("gpu", 0))
    if a.get("with_model") and device == "gpu":
        res["model"] = with_model(model, pipe, files, B, res.get("images_per_s"), res.get("gpu_util_pct"))
    pipe.close()
    return res


def fidelity(ops: tuple, files: list[Path], gpu: int) -> dict:
    """GPU outputs against the CPU path's for the same records (the chain up to normalize, in uint8 levels)."""
    import numpy as np

    from ..pipelines.image import ImagePipeline

    body = tuple(op for op in ops if op.kind != "normalize")
    blobs, keys = [p.read_bytes() for p in files], file_keys(files)
    with ImagePipeline(body, device="gpu", seed=0, gpu=gpu) as g, ImagePipeline(body, device="cpu", seed=0) as c:
        gb = g(blobs, keys)
        g.engine.stream.synchronize()
        got = [gb.item(i).get() for i in range(len(gb))]
        ref = c(blobs, keys)
    diffs = [np.abs(x.astype(np.int32) - y.astype(np.int32)) for x, y in zip(got, ref) if x.shape == y.shape]
    if not diffs:
        return {"images": 0}
    return {"images": len(diffs), "max_abs_diff": int(max(d.max() for d in diffs)),
            "mean_abs_diff": float(np.mean([d.mean() for d in diffs])), "units": "uint8 levels"}


def with_model(model: Any, pipe: Any, files: list[Path], batch: int, pipe_images_per_s: float | None = None,
               pipe_util_pct: float | None = None) -> dict:
    """A real training step of torchvision's model (random weights, channels_last, AMP) fed by in-memory
    synthetic batches ("model alone") and by the pipeline ("model + pipeline"), judged with the
    pipeline's own speed and GPU utilisation from the same run (:func:`model_sharing`)."""
    try:
        import torch
        import torchvision
    except ImportError as e:
        return {"skipped": f"torch/torchvision not importable: {e}"}
    if model.torchvision is None:
        return {"skipped": f"no torchvision model for {model.name}"}
    net = getattr(torchvision.models, model.torchvision)(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train(x: Any) -> int:
        y = torch.randint(0, 1000, (x.shape[0],), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return int(x.shape[0])

    fake = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    alone = timed_windows(lambda: train(fake), 10.0, warmup=5, sync=torch.cuda.synchronize)
    it = pipe.iterate_files(files, file_keys(files), batch, repeat=True)

    def fed() -> int:
        out = next(it)
        x = torch.from_dlpack(out).to(memory_format=torch.channels_last)
        return train(x)

    both = timed_windows(fed, 10.0, warmup=3, sync=torch.cuda.synchronize)
    it.close()
    return {"model": model.torchvision,
            **model_sharing(alone["images_per_s"], both["images_per_s"], pipe_images_per_s, pipe_util_pct)}


def model_sharing(alone: float, fed: float, pipe_images_per_s: float | None, pipe_util_pct: float | None) -> dict:
    """The ``--with-model`` figures: the model's images/s alone and fed by the pipeline; ``starved`` when
    fed runs under 95% of alone. With the pipeline's own images/s and mean GPU utilisation (NVML: the
    share of time a kernel ran; the hardware JPEG engine is not counted) also the pipeline's GPU time
    per image and the most both could reach on one GPU were their GPU times simply to add up
    (``shared_ceiling_images_per_s``): how much of the gap sharing the GPU explains."""
    out: dict[str, Any] = {"model_alone_images_per_s": alone, "model_plus_pipeline_images_per_s": fed,
                           "starved": fed < 0.95 * alone}
    if pipe_images_per_s and pipe_util_pct is not None and alone > 0:
        per_image = pipe_util_pct / 100.0 / pipe_images_per_s  # GPU-seconds of the pipeline's kernels per image
        out["pipeline_gpu_us_per_image"] = per_image * 1e6
        out["shared_ceiling_images_per_s"] = 1.0 / (1.0 / alone + per_image)
    return out


def run_dataloader(a: dict) -> dict:
    try:
        import torch
        import torchvision.transforms as T
    except ImportError as e:
        return {"skipped": f"torch/torchvision not importable: {e}"}
    model = get_model(a["model"])
    norm = [T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    tf = {("resnet50", "train"): T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *norm]),
          ("resnet50", "val"): T.Compose([T.Resize(256), T.CenterCrop(224), *norm]),
          ("decode-only", "decode"): T.PILToTensor(),
          ("transcode", "transcode"): T.Resize(256)}.get((model.name, a["chain"]))
    if tf is None:
        return {"skipped": f"no torchvision equivalent of {model.name}/{a['chain']} (boxes need transforms.v2)"}
    files = data_files(a["data"], a["images"])
    encode = model.encode
    ds = _Files(files, tf, encode)
    workers = os.cpu_count() or 1
    # the files in order, over and over, as one long epoch: no epoch boundary (where the workers' queues
    # drain and refill) falls inside the timed run, as ImagePipeline.iterate_files(repeat=True) has none
    dl = torch.utils.data.DataLoader(ds, batch_size=a["batch_size"], num_workers=workers, persistent_workers=True,
                                     prefetch_factor=4, collate_fn=None if not encode else list,
                                     sampler=Cycle(len(files), 10_000))
    it = iter(dl)

    def step() -> int:
        return len(next(it))

    cpu = CpuUse()
    # every worker has started and made its first batches before the clock starts (with only one pass
    # of warm-up its first window ran at a sixth of the others)
    warm = max(warmup_batches(a), 2 * workers)
    res = timed_windows(step, a["seconds"], warmup=warm)
    res["cpu_cores_used"] = cpu.stop()
    res["host_cpu"] = cpu.host
    res["workers"], res["warmup_batches"] = workers, warm
    return res


class _Files:
    def __init__(self, files: list[Path], tf: Any, encode: bool):
        self.files, self.tf, self.encode = files, tf, encode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import io

        from PIL import Image

        img = self.tf(Image.open(self.files[i]).convert("RGB"))
        if self.encode:
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            return buf.getvalue()
        return img


DALI_CHAINS = (("resnet50", "train"), ("resnet50", "val"), ("decode-only", "decode"))


def dali_pipeline(a: dict, setting: str = "best"):
    """DALI's pipeline for ``a``'s model and chain (built), or a string saying why there is none.

    ``best``: full decode on the hardware JPEG engine with ``hw_decoder_load=0.9``, then DALI's GPU ops
    (the setting DALI measured fastest on mixed data); ``defaults``: DALI's defaults, a region decode
    (``decoders.image_random_crop``) for the training chain and the default decoder load."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy  # noqa: F401  (version check)
    except ImportError as e:
        return f"nvidia.dali not importable: {e}"
    model = get_model(a["model"])
    if (model.name, a["chain"]) not in DALI_CHAINS:
        return f"no DALI pipeline for {model.name}/{a['chain']} (DALI cannot encode or write)"
    files = [str(p) for p in data_files(a["data"], a["images"])]

    from .dali_ops import dali_chain

    @pipeline_def(batch_size=a["batch_size"], num_threads=os.cpu_count() or 4, device_id=a.get("gpu", 0))
    def pipe():
        jpegs, _ = fn.readers.file(files=files, random_shuffle=False, name="r")
        return dali_chain(fn, types, jpegs, a["chain"], setting)

    p = pipe()
    p.build()
    return p


def run_dali(a: dict, setting: str = "best") -> dict:
    """DALI's pipeline (:func:`dali_pipeline`) timed as gpubatch's is: one pass untimed, then windows of
    ``Pipeline.run()``, which returns once the batch is ready; with ``a["dali_sync"]`` the whole device
    is synchronized after every batch as well (a check of that, not the default)."""
    sampler = GpuSampler(a.get("gpu", 0))  # before DALI touches CUDA
    p = dali_pipeline(a, setting)
    if isinstance(p, str):
        sampler.summary()
        return {"skipped": p}
    sync = lambda: None  # noqa: E731
    if a.get("dali_sync"):
        import cupy as cp

        sync = cp.cuda.runtime.deviceSynchronize
    sampler.measuring = True
    cpu = CpuUse()
    res = timed_windows(lambda: (p.run(), a["batch_size"])[1], a["seconds"], warmup=warmup_batches(a), sync=sync)
    res["cpu_cores_used"] = cpu.stop()
    res["host_cpu"] = cpu.host
    res.update(sampler.summary())
    res["setting"] = setting
    return res


def _run(a: dict) -> dict:
    name = a["contender"]
    if a.get("dataset"):  # a dataset gpubatch wrote: the loader against the readers of its format
        from .loader import run_loader_contender

        return run_loader_contender(a)
    if get_model(a["model"]).media == "video":
        from .video import run_video_contender

        return run_video_contender(a)
    if get_model(a["model"]).media == "audio":
        from .audio import run_audio_contender

        return run_audio_contender(a)
    if name == "gpubatch-gpu":
        return run_gpubatch(a, "gpu")
    if name == "gpubatch-cpu":
        return run_gpubatch(a, "cpu")
    if name == "torch-dataloader":
        return run_dataloader(a)
    if name == "dali":
        return run_dali(a, "best")
    if name == "dali-defaults":
        return run_dali(a, "defaults")
    return {"error": f"unknown contender {name!r}"}


def main() -> None:
    from ..errors import GpubatchError

    try:
        res = _run(json.loads(sys.argv[1]))
    except GpubatchError as e:  # the contender refused the setting (a --gpu-memory too small): its one line
        res = {"error": str(e)}
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
