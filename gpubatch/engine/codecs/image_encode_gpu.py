"""Batched image encode on the GPU: JPEG a whole batch in a few launches (:mod:`.jpeg_gpu`), or through
nvImageCodec's CUDA encoder image by image; PNG (lossless) on CPU threads.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import image as host
from .nvimgcodec_c import nvimgcodec


class GpuImageEncoder:
    """Batched JPEG encode on the GPU; PNG (lossless) on the CPU threads.

    ``jpeg="batched"`` (the default) encodes a whole batch in a few launches
    (:mod:`~gpubatch.engine.codecs.jpeg_gpu`); ``jpeg="nvimagecodec"`` uses nvImageCodec's CUDA encoder,
    image by image (slower on small images; kept to compare against).
    """

    THREADS = 4
    KINDS = ("batched", "nvimagecodec")

    def __init__(self, device_index: int = 0, cpu_threads: int = 8, jpeg: str = "batched", staging: Any = None):
        if jpeg not in self.KINDS:
            raise ValueError(f"unknown JPEG encoder {jpeg!r}; supported: {', '.join(self.KINDS)}")
        self.jpeg = jpeg
        if jpeg == "batched":
            import cupy as cp

            from ..batch import PinnedStaging
            from .jpeg_gpu import BatchedJpegEncoder

            self.batched = BatchedJpegEncoder(cp, staging or PinnedStaging(cp))
        else:
            nic = nvimgcodec()
            self.nic = nic
            # 4 threads: 7,430 images/s on 224x224 batches against 6,055 with the default (one per core)
            # and 6,770 with 8 (the decode study (docs/engine.md), group "encode")
            self.encoder = nic.Encoder(device_id=device_index, max_num_cpu_threads=self.THREADS)
        self._cpu = ThreadPoolExecutor(max_workers=max(1, cpu_threads), thread_name_prefix="gpubatch-encode")

    def close(self) -> None:
        self._cpu.shutdown(wait=True)

    def encode_batch(self, batch: Any, idx: list[int], codec: str, quality: int, stream,
                     sink: Any = None) -> list[Any]:
        """Encode items ``idx`` of a uint8 HWC :class:`~gpubatch.engine.batch.DeviceBatch` (the batched
        JPEG encoder reads them in place, without a view object per item, and writes into ``sink``
        when given: :class:`~gpubatch.engine.codecs.jpeg_gpu.EncodedSpan` values then come back)."""
        if codec == "jpeg" and self.jpeg == "batched":
            from ..batch import Ragged

            return list(self.batched.encode(Ragged.from_batch(batch).take(idx), quality, stream, sink))
        return self.encode([batch.item(k) for k in idx], codec, quality, stream)

    def encode(self, arrays: list[Any], codec: str, quality: int, stream) -> list[bytes | None]:
        """Encode CuPy uint8 HWC arrays (ordered on ``stream``); None where the encoder failed."""
        if not arrays:
            return []
        if codec == "jpeg" and self.jpeg == "batched":
            return list(self.batched.encode(arrays, quality, stream))
        if codec == "jpeg":
            nic = self.nic
            images = [nic.as_image(a, cuda_stream=stream.ptr) for a in arrays]
            params = nic.EncodeParams(quality_type=nic.QualityType.QUALITY, quality_value=float(quality),
                                      chroma_subsampling=nic.ChromaSubsampling.CSS_420)
            out = self.encoder.encode(images, "jpeg", params=params, cuda_stream=stream.ptr)
            return [bytes(cs) if cs is not None else None for cs in out]
        hosts = [a.get(stream=stream) for a in arrays]
        stream.synchronize()
        return list(self._cpu.map(lambda a: host.encode(a, codec, quality), hosts))
