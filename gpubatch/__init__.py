"""gpubatch: a GPU batch engine for whole datasets.

Convert datasets between JPEG/PNG folders, LMDB, TFRecord, MXNet RecordIO, COCO and WebDataset,
passing encoded bytes through untouched or decoding, transforming and re-encoding them (on the GPU
when one is usable, else on the CPU). Importing this package is cheap: the heavy parts (Pillow,
CuPy, nvImageCodec) load on first use.

    >>> import gpubatch
    >>> summary = gpubatch.convert("imagenet/train", "out/train-wds", to="webdataset")
    >>> gpubatch.info("out/train-wds").records
"""

from __future__ import annotations

import sys as _sys

__version__ = "0.1.0"

if _sys.argv[:1] and _sys.argv[0].rsplit("/", 1)[-1] in ("gpubatch", "-m"):  # the command: Ctrl-C while it starts
    import signal as _signal  # is one line (gpubatch.cli)

    def _interrupted(signum: int, frame: object) -> None:
        import os

        os.write(2, b"interrupted\n")
        os._exit(130)

    try:
        _signal.signal(_signal.SIGINT, _interrupted)
    except ValueError:  # pragma: no cover - not the main thread
        pass

_LAZY = {
    "convert": ("gpubatch.api", "convert"),
    "augment": ("gpubatch.api", "augment"),
    "finish": ("gpubatch.api", "finish"),
    "AugmentRequest": ("gpubatch.api", "AugmentRequest"),
    "info": ("gpubatch.api", "info"),
    "verify": ("gpubatch.api", "verify"),
    "open_dataset": ("gpubatch.api", "open_dataset"),
    "ConvertRequest": ("gpubatch.api", "ConvertRequest"),
    "RunSummary": ("gpubatch.api", "RunSummary"),
    "DatasetReport": ("gpubatch.report.info", "DatasetReport"),
    "Record": ("gpubatch.types", "Record"),
    "Boxes": ("gpubatch.types", "Boxes"),
    "Media": ("gpubatch.types", "Media"),
    "DatasetInfo": ("gpubatch.types", "DatasetInfo"),
    "GpubatchError": ("gpubatch.errors", "GpubatchError"),
    "RecordError": ("gpubatch.errors", "RecordError"),
    "ErrorPolicy": ("gpubatch.errors", "ErrorPolicy"),
    "format_names": ("gpubatch.formats", "format_names"),
    "ImagePipeline": ("gpubatch.pipelines.image", "ImagePipeline"),
    "VideoPipeline": ("gpubatch.pipelines.video", "VideoPipeline"),
    "AudioPipeline": ("gpubatch.pipelines.audio", "AudioPipeline"),
    "loader": ("gpubatch.training", "loader"),
    "Loader": ("gpubatch.training", "Loader"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpubatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
