"""The GPU image decoder through nvImageCodec's Python binding: the fallback where its C library cannot
be loaded, and the reference the C path is tested against (a part of
:class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder`).
"""

from __future__ import annotations

import time
from typing import Any

from .decode_buffers import _Release
from .decode_result import DecodeResult, DeviceImage, _device_image


class PythonBindingDecode:
    """The Python binding's decode path of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder`
    (a mixin: the decoder's state is the instance's): one output allocation per image, the CUDA
    decoder called from a second thread beside the hardware calls."""

    def _call(self, decoder, stream, blobs: list[bytes]) -> tuple[list[Any], float]:
        """One decode call, not waited for on the GPU; (results, host seconds)."""
        if not blobs:
            return [], 0.0
        t0 = time.perf_counter()
        out = decoder.decode(blobs, params=self.params, cuda_stream=stream.ptr)
        return out, time.perf_counter() - t0

    def _sub_streams(self, blobs: list[Any], regions: list[tuple[int, int, int, int] | None]) -> list[Any]:
        """What the GPU decoders get: the encoded bytes, or a region of them as an nvImageCodec sub-stream."""
        nic = self.nic
        out = list(blobs)
        for i, r in enumerate(regions):
            if r is not None:
                try:
                    cs = nic.CodeStream(blobs[i])
                except TypeError:  # a buffer type the constructor does not take
                    cs = nic.CodeStream(bytes(blobs[i]))
                out[i] = cs.get_sub_code_stream(region=nic.Region(*r))
        return out

    def _gpu_python(self, blobs, regions, kinds, to_hw, to_cuda, stream, res: DecodeResult) -> list[int]:
        """Decode through nvImageCodec's Python binding (one output allocation per image)."""
        tm = self.timings
        arrays = res.arrays
        to_cpu: list[int] = []
        t0 = time.perf_counter()
        gpu_in = self._sub_streams(blobs, regions) if regions is not None and any(regions) else blobs
        side = self._side.submit(self._call, self.cuda, self.cuda_stream, [gpu_in[i] for i in to_cuda])
        hw_out: list[Any] = []
        for lst in to_hw:  # one call per kind: the engine's host side is slower on mixed calls
            hw_out.extend(self._call(self.hw, self.hw_stream, [gpu_in[i] for i in lst])[0])
        to_hw = [i for lst in to_hw for i in lst]
        t1 = time.perf_counter()
        t_hw = t1 - t0
        tm["hw"] += t1 - t0
        for i, img in zip(to_hw, hw_out):
            if img is not None:
                arrays[i] = img
        res.hw += sum(img is not None for img in hw_out)
        retry = self._learn(kinds, to_hw, [img is not None for img in hw_out])
        cuda_out, t_cuda = side.result()
        t2 = time.perf_counter()
        tm["cuda"] += t2 - t1
        self._adapt(t_hw, t_cuda)
        for i, img in zip(to_cuda, cuda_out):
            if img is None:
                to_cpu.append(i)
            else:
                arrays[i] = img
        if retry:
            out, _ = self._call(self.cuda, self.cuda_stream, [gpu_in[i] for i in retry])
            for i, img in zip(retry, out):
                if img is None:
                    to_cpu.append(i)
                else:
                    arrays[i] = img
        # every DeviceImage holds ``owner``, so the images are freed (stream-ordered) with the last of them
        owner = _Release([], stream, self._freed)
        for i in range(len(arrays)):
            img = arrays[i]
            if img is None or isinstance(img, DeviceImage):
                continue
            ref = _device_image(img, owner)
            if ref is None:  # an odd result (alpha, 16 bit): let the CPU path do it
                arrays[i] = None
                to_cpu.append(i)
                continue
            owner.images.append(img)
            arrays[i] = ref
            res.on_gpu += 1
        if owner.images:
            res.keep.append(owner)
        tm["hw_wrap"] += time.perf_counter() - t2
        return to_cpu
