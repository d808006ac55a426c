"""GPU image codecs on nvImageCodec: routed batched JPEG decode and batched JPEG encode.

Decode. A batch that mixes JPEG kinds runs at the pace of the slowest decoder, so each JPEG's header
(SOF type, chroma subsampling) is read first and the batch is split: what the hardware JPEG engine
takes goes to a ``HW_GPU_ONLY`` decoder, the rest to the CUDA decoder (Huffman on the GPU), both at
once from two threads on their own streams. Which kinds the hardware engine takes is learned, not
assumed: a kind it returns None for is routed to the CUDA decoder from then on. Whatever the GPU
decoders refuse (CMYK, PNG, corrupt data) is decoded by Pillow into its slot and counted as a
fallback; only a record that fails there too becomes an error. EXIF orientation is applied.

Encode. ``nvimgcodec.Encoder`` on the GPU (CUDA encoder; Hopper has no hardware JPEG encoder),
batched, from zero-copy views of the packed output buffer.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import DependencyError
from ...types import sniff_image_codec
from . import image as host
from .image import jpeg_header

# SOF markers nvJPEG's GPU decoders handle (baseline, extended, progressive Huffman).
_GPU_SOF = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
_GPU_SUB = {"4:2:0", "4:2:2", "4:4:4", "4:4:0", "gray"}


def nvimgcodec():
    try:
        from nvidia import nvimgcodec as nic
    except ImportError:
        raise DependencyError("GPU image codecs need nvImageCodec: pip install 'gpubatch[cu13]'") from None
    return nic


def jpeg_kind(data: bytes) -> tuple[str | None, int, int]:
    """("baseline/4:2:0"-style kind, width, height) of a JPEG the GPU decoders may take, else (None, w, h)."""
    hdr = jpeg_header(data)
    if hdr is None:
        return None, 0, 0
    sof, sub, w, h = hdr
    if sof not in _GPU_SOF or sub not in _GPU_SUB:
        return None, w, h
    return f"{_GPU_SOF[sof]}/{sub}", w, h


@dataclass
class DecodeResult:
    """Decoded images of one batch, in input order.

    Attributes:
        arrays: per item a CuPy uint8 (H, W, 3) array on the consumer stream, or None when it failed.
        errors: per item None or the reason it could not be decoded by any path.
        on_gpu: how many the GPU decoders produced; ``hw`` of those by the hardware engine.
        fallbacks: how many Pillow decoded after the GPU refused them.
        keep: objects that own the device memory (nvImageCodec Images); hold them until the kernels
            reading ``arrays`` have finished.
    """

    arrays: list[Any]
    errors: list[str | None]
    on_gpu: int = 0
    hw: int = 0
    fallbacks: int = 0
    keep: list[Any] = field(default_factory=list)


class GpuImageDecoder:
    """Batched, routed JPEG decode on one GPU (see the module docstring)."""

    def __init__(self, device_index: int = 0, batch_size: int = 256, cpu_threads: int = 8,
                 hw_decoder: bool = True):
        import cupy as cp

        nic = nvimgcodec()
        self.cp, self.nic = cp, nic
        self.device_index = device_index
        opts = (f"nvjpeg_hw_decoder:preallocate_batch_size={batch_size} "
                "nvjpeg_hw_decoder:preallocate_width_hint=640 nvjpeg_hw_decoder:preallocate_height_hint=640")
        with cp.cuda.Device(device_index):
            self.hw = (nic.Decoder(device_id=device_index, max_num_cpu_threads=2,
                                   backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)], options=opts)
                       if hw_decoder else None)
            self.cuda = nic.Decoder(device_id=device_index, max_num_cpu_threads=cpu_threads,
                                    backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)],
                                    options="nvjpeg_cuda_decoder:hybrid_huffman_threshold=0")
            self.hw_stream = cp.cuda.Stream(non_blocking=True)
            self.cuda_stream = cp.cuda.Stream(non_blocking=True)
        self.params = nic.DecodeParams(apply_exif_orientation=True, color_spec=nic.ColorSpec.SRGB,
                                       allow_any_depth=False)
        self.hw_refuses: set[str] = set()
        self.hw_takes: set[str] = set()
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpubatch-cuda-decode")
        self._cpu = ThreadPoolExecutor(max_workers=max(1, cpu_threads), thread_name_prefix="gpubatch-cpu-decode")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._side.shutdown(wait=True)
        self._cpu.shutdown(wait=True)

    def _decode(self, decoder, stream, blobs: list[bytes]) -> list[Any]:
        if not blobs:
            return []
        return decoder.decode(blobs, params=self.params, cuda_stream=stream.ptr)

    def decode(self, blobs: list[bytes], stream, max_pixels: int = 0) -> DecodeResult:
        """Decode ``blobs`` into uint8 RGB HWC arrays ordered on ``stream`` (a CuPy stream)."""
        cp = self.cp
        n = len(blobs)
        arrays: list[Any] = [None] * n
        errors: list[str | None] = [None] * n
        kinds: list[str | None] = [None] * n
        to_hw, to_cuda, to_cpu = [], [], []
        for i, b in enumerate(blobs):
            kind, w, h = jpeg_kind(b)
            if max_pixels and w * h > max_pixels:
                errors[i] = f"image of {w}x{h} = {w * h} pixels exceeds --max-pixels {max_pixels}"
                continue
            kinds[i] = kind
            if kind is None:
                to_cpu.append(i)
            elif self.hw is not None and kind not in self.hw_refuses:
                to_hw.append(i)
            else:
                to_cuda.append(i)
        side = self._side.submit(self._decode, self.cuda, self.cuda_stream, [blobs[i] for i in to_cuda])
        hw_out = self._decode(self.hw, self.hw_stream, [blobs[i] for i in to_hw]) if to_hw else []
        retry = []
        res = DecodeResult(arrays, errors)
        for i, img in zip(to_hw, hw_out):
            if img is None:
                retry.append(i)
            else:
                arrays[i] = img
                res.hw += 1
        with self._lock:  # a kind the engine decoded even once is not refused for a corrupt file
            for i, img in zip(to_hw, hw_out):
                if img is not None:
                    self.hw_takes.add(kinds[i])
            for i in retry:
                if kinds[i] not in self.hw_takes:
                    self.hw_refuses.add(kinds[i])
        for i, img in zip(to_cuda, side.result()):
            if img is None:
                to_cpu.append(i)
            else:
                arrays[i] = img
        if retry:
            for i, img in zip(retry, self._decode(self.cuda, self.cuda_stream, [blobs[i] for i in retry])):
                if img is None:
                    to_cpu.append(i)
                else:
                    arrays[i] = img
        # Hand the GPU results to the consumer stream: DLPack makes it wait on each decode's event.
        with stream:
            for i in range(n):
                img = arrays[i]
                if img is None:
                    continue
                arr = cp.from_dlpack(img)
                if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != cp.uint8:
                    arrays[i] = None  # an odd result (alpha, 16 bit): let the CPU path do it
                    to_cpu.append(i)
                    continue
                res.keep.append(img)
                arrays[i] = arr
                res.on_gpu += 1
        to_cpu = sorted(set(to_cpu))
        if to_cpu:
            decoded = list(self._cpu.map(lambda i: _host_decode(blobs[i], max_pixels), to_cpu))
            with stream:
                for i, (arr, err) in zip(to_cpu, decoded):
                    if err is not None:
                        errors[i] = err
                    else:
                        arrays[i] = cp.asarray(arr)
                        res.fallbacks += 1
        return res


def _host_decode(data: bytes, max_pixels: int) -> tuple[np.ndarray | None, str | None]:
    try:
        return host.decode(data, max_pixels), None
    except ValueError as e:
        return None, str(e)


class GpuImageEncoder:
    """Batched JPEG encode on the GPU; PNG (lossless) on the CPU threads."""

    def __init__(self, device_index: int = 0, cpu_threads: int = 8):
        nic = nvimgcodec()
        self.nic = nic
        self.encoder = nic.Encoder(device_id=device_index)
        self._cpu = ThreadPoolExecutor(max_workers=max(1, cpu_threads), thread_name_prefix="gpubatch-encode")

    def close(self) -> None:
        self._cpu.shutdown(wait=True)

    def encode(self, arrays: list[Any], codec: str, quality: int, stream) -> list[bytes | None]:
        """Encode CuPy uint8 HWC arrays (ordered on ``stream``); None where the encoder failed."""
        if not arrays:
            return []
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


def is_gpu_decodable(data: bytes) -> bool:
    """True when the header says the GPU decoders may take these bytes (a baseline/progressive JPEG)."""
    return sniff_image_codec(data) == "jpeg" and jpeg_kind(data)[0] is not None
