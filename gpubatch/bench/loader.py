"""The bench on a dataset gpubatch wrote (``gpubatch bench --model resnet50 --data DATASET``): the training
loader (:func:`gpubatch.loader`) against DALI's reader of the same shards and a webdataset + torchvision
DataLoader, each in its own process as every contender (:mod:`.contenders`).

- ``gpubatch-loader`` / ``gpubatch-loader-cpu``: :class:`~gpubatch.training.Loader` on the GPU / the CPU
  (its pipeline's worker processes), epochs one after the other (a new order each), images and labels a batch.
- ``dali-reader``: DALI's reader of the format (``readers.webdataset`` with the shards' own index files,
  ``readers.tfrecord``, ``readers.mxnet`` for RecordIO, ``readers.caffe`` for LMDB), its mixed decoder at the
  setting DALI measured fastest (``hw_decoder_load=0.9``) and the chain's ops, as the ``dali`` contender on files.
- ``webdataset-dataloader``: ``webdataset.WebDataset`` (shards resampled by each worker, Pillow decode,
  torchvision transforms) in a PyTorch DataLoader, a worker a core (webdataset shards only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import chain_ops, get_model
from .measure import GpuSampler, timed_contender

LOADER_CONTENDERS = ("gpubatch-loader", "gpubatch-loader-cpu", "dali-reader", "webdataset-dataloader")
LOADER_GPU = ("gpubatch-loader", "dali-reader")


def dataset_source(data: Path) -> dict[str, Any] | None:
    """What the bench reads where ``data`` is a dataset gpubatch wrote (its manifest), else None."""
    from ..formats.manifest import read_manifest

    manifest = read_manifest(Path(data)) if Path(data).is_dir() else None
    if not manifest or "format" not in manifest:
        return None
    return {"path": str(data), "kind": f"a {manifest['format']} dataset gpubatch wrote", "format": manifest["format"],
            "images": int(manifest.get("records", 0)), "what": "records"}


def run_loader_contender(a: dict) -> dict:
    name = a["contender"]
    if name in ("gpubatch-loader", "gpubatch-loader-cpu"):
        return run_loader(a, "gpu" if name == "gpubatch-loader" else "cpu")
    if name == "dali-reader":
        return run_dali_reader(a)
    if name == "webdataset-dataloader":
        return run_wds_dataloader(a)
    return {"error": f"unknown contender {name!r}"}


def run_loader(a: dict, device: str) -> dict:
    from ..training import Loader

    sampler = GpuSampler(a.get("gpu", 0)) if device == "gpu" else None
    ops = chain_ops(get_model(a["model"]).chains[a["chain"]])
    dl = Loader(a["data"], ops, batch_size=a["batch_size"], device=device, seed=0, keys=("image", "label"),
                gpu=a.get("gpu", 0))

    def epochs() -> Any:
        epoch = 0
        while True:
            dl.set_epoch(epoch)
            yield from dl
            epoch += 1

    it = epochs()

    def step() -> int:
        _, labels = next(it)  # (the pipeline hands a batch over once its stream is done)
        return len(labels)

    res = timed_contender(step, a, sampler)
    if sampler is not None:
        res.update(sampler.summary())
    res["skipped_records"] = len(dl.skipped)
    eng = getattr(dl._pipe, "engine", None)
    if eng is not None:  # where the GPU pipeline's time went, as the files contender reports it
        res["decode_route"] = {"route": eng.decoder.route, "start": eng.decode_route}
        res["hw_decoder_share"] = dl._pipe.stats["hw"] / max(dl._pipe.stats["gpu"], 1)
        res["decoder_s"] = {k: round(v, 3) for k, v in eng.decoder.timings.items()}
        res["stages_s"] = {k: round(v, 3) for k, v in dl._pipe.timings.items()}
    it.close()
    dl.close()
    return res


def _shards(data: str, suffix: str) -> tuple[list[str], list[str]]:
    files = sorted(str(p) for p in Path(data).glob(f"*{suffix}"))
    return files, [f[: -len(suffix)] + ".idx" for f in files]


def run_dali_reader(a: dict) -> dict:
    from .dali_ops import dali_chain

    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as e:
        return {"skipped": f"nvidia.dali not importable: {e}"}
    fmt = a["format"]
    if fmt == "webdataset":
        paths, index = _shards(a["data"], ".tar")
    elif fmt == "tfrecord":
        paths, index = _shards(a["data"], ".tfrecord")
    elif fmt == "recordio":
        paths, index = _shards(a["data"], ".rec")
    elif fmt == "lmdb":  # (Caffe Datums under %08d keys: the database is the folder)
        paths, index = ([a["data"]], []) if os.path.exists(os.path.join(a["data"], "data.mdb")) else ([], [])
    else:
        return {"skipped": f"no DALI reader of gpubatch's {fmt} output here (webdataset, tfrecord, recordio, lmdb)"}
    if not paths or not all(os.path.exists(i) for i in index):
        return {"skipped": f"{a['data']}: no {fmt} shards with their index files"}
    sampler = GpuSampler(a.get("gpu", 0))  # before DALI touches CUDA

    @pipeline_def(batch_size=a["batch_size"], num_threads=os.cpu_count() or 4, device_id=a.get("gpu", 0))
    def pipe():
        if fmt == "webdataset":
            jpegs, labels = fn.readers.webdataset(paths=paths, index_paths=index, ext=["jpg", "cls"],
                                                  random_shuffle=True, name="r")
        elif fmt == "tfrecord":
            import nvidia.dali.tfrecord as tfrec

            feats = fn.readers.tfrecord(path=paths, index_path=index, random_shuffle=True, name="r",
                                        features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                                  "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
            jpegs, labels = feats["image/encoded"], feats["image/class/label"]
        elif fmt == "lmdb":
            jpegs, labels = fn.readers.caffe(path=paths[0], random_shuffle=True, name="r")
        else:
            jpegs, labels = fn.readers.mxnet(path=paths, index_path=index, random_shuffle=True, name="r")
        return dali_chain(fn, types, jpegs, a["chain"], "best"), labels

    p = pipe()
    p.build()
    res = timed_contender(lambda: (p.run(), a["batch_size"])[1], a, sampler)
    res.update(sampler.summary())
    res["reader"] = {"webdataset": "readers.webdataset", "tfrecord": "readers.tfrecord", "recordio": "readers.mxnet",
                     "lmdb": "readers.caffe"}[fmt]
    return res


def run_wds_dataloader(a: dict) -> dict:
    try:
        import torch
        import torchvision.transforms as T
        import webdataset as wds
    except ImportError as e:
        return {"skipped": f"torch, torchvision or webdataset not importable: {e}"}
    if a["format"] != "webdataset":
        return {"skipped": "webdataset reads webdataset shards only"}
    norm = [T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    tf = {"train": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *norm]),
          "val": T.Compose([T.Resize(256), T.CenterCrop(224), *norm])}.get(a["chain"])
    if tf is None:
        return {"skipped": f"no torchvision equivalent of the {a['chain']} chain"}
    tars, _ = _shards(a["data"], ".tar")
    workers = os.cpu_count() or 1
    ds = (wds.WebDataset(tars, resampled=True, shardshuffle=False, nodesplitter=wds.split_by_node)
          .decode("pil").to_tuple("jpg", "cls").map_tuple(tf, int).batched(a["batch_size"]))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True,
                                     prefetch_factor=4)
    it = iter(dl)

    def step() -> int:
        images, _ = next(it)
        return len(images)

    res = timed_contender(step, a, warmup=max(3, 2 * workers))
    res["workers"] = workers
    return res
