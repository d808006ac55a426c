"""The hardware JPEG engine's instances of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder`: made
(nvJPEG's direct path, else nvImageCodec's hardware decoder), taken from a worker's start as it makes them
(:mod:`~gpubatch.engine.gpu.start`), one more a kind where a batch brings more kinds than instances, and the
one each call takes.

An instance waits, at the start of each call, until its previous call has finished on the GPU, and one
that meets another kind than last time decodes at about half speed: so the calls spread over several
instances, and each kind keeps its own.
"""

from __future__ import annotations

import warnings
from typing import Any

from ...errors import DependencyError
from .nvjpeg_hw import HwBatchDecoder, NvjpegError


class HwInstances:
    """The hardware-instance part of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder` (a mixin: the
    decoder's state, its ``settings``, ``hw_direct`` and ``hw_cs`` among it, is the instance's)."""

    def _more_hw(self, n: int, direct: bool) -> None:
        """``n`` more hardware-engine instances (the C API): nvJPEG's direct path where ``direct`` and
        it can make them, else nvImageCodec's hardware decoder."""
        if direct:
            self.hw_direct.extend(self._direct_instances(n))
        if not self.hw_direct:
            from .nvimgcodec_c import BACKEND_HW_GPU_ONLY

            self.hw_cs.extend(self.lib.decoder(self.device_index, self.HW_THREADS, BACKEND_HW_GPU_ONLY, self._hw_options)
                              for _ in range(n))

    def _adopt_hw(self) -> None:
        """(The hardware engine's thread, before a part's calls.) The instances the worker's start has made
        since this decoder took the first (``hw_later``), not waited for; where the start has ended short of
        them, the rest made here (the decoder decodes on with those it has where it cannot)."""
        from ..gpu.start import hardware_coming, hardware_rest
        from ..gpu.start import hardware_instances as started

        hardware_rest(self.device_index)  # (asked for by the warm-up, where one ran)
        still = hardware_coming(self.device_index)
        got = started(self.device_index, self._hw_coming, wait=False)
        self.hw_direct.extend(got)
        self._cold.update(id(d) for d in got)
        self._hw_coming -= len(got)
        if self._hw_coming and not still:  # (the start failed them: made again here, or said why not)
            short, self._hw_coming = self._hw_coming, 0
            try:
                for _ in range(short):
                    self.hw_direct.append(HwBatchDecoder(self.cp))
            except (DependencyError, NvjpegError, OSError) as e:  # the instances there decode on
                warnings.warn(f"no more hardware-engine instances ({e})", RuntimeWarning, stacklevel=2)

    def _direct_instances(self, n: int) -> list[Any]:
        """``n`` instances of the hardware engine's direct path, or none (with a warning) where nvJPEG
        cannot make them (then nvImageCodec's hardware decoder is used)."""
        from ..gpu.start import hardware_coming
        from ..gpu.start import hardware_instances as started

        if self._hw_coming:  # (those the start is making for this decoder first)
            n, self._hw_coming = n + self._hw_coming, 0
        later = self.hw_later and hardware_coming(self.device_index)
        made: list[Any] = started(self.device_index, n, wait=not later)  # (those the worker's start made already)
        if later and made:  # the rest as the start makes them (_adopt_hw)
            self._hw_coming = n - len(made)
            n = len(made)
        try:
            for _ in range(n - len(made)):
                made.append(HwBatchDecoder(self.cp))
        except (DependencyError, NvjpegError, OSError) as e:
            for dec in made:
                dec.close()
            warnings.warn(f"the hardware JPEG engine is not usable through nvJPEG directly ({e}); using "
                          "nvImageCodec's hardware decoder", RuntimeWarning, stacklevel=3)
            return []
        return made

    def _enough_hw(self, kinds: int) -> None:
        """(The hardware engine's thread, before a part's calls.) Where the part has ``kinds`` kinds and the
        engine fewer instances, one more instance a kind up to ``settings.hw_only_instances``: two instances
        that switch kinds call after call held the whole chain to half speed (a 0.15 CUDA share on a mix
        with a quarter of 4:4:4: 10,011-11,093 against 20,825-21,800 images/s; docs/engine.md). Only where
        ``grow_hw`` (``settings.hw_per_kind``, and no memory cap: an instance is about 55 MiB that a plan
        does not count); the instances made are spares past ``_hw_first``, taken by a kind none of the first
        has (:meth:`_hw_instance`)."""
        pool = self.hw_direct or self.hw_cs
        want = min(kinds, self.settings.hw_only_instances)
        if not self.grow_hw or not pool or len(pool) >= want:
            return
        try:
            self._more_hw(want - len(pool), bool(self.hw_direct))
        except Exception as e:  # noqa: BLE001 - the instances there decode on
            self.grow_hw = False
            warnings.warn(f"no more hardware-engine instances ({e})", RuntimeWarning, stacklevel=2)

    def _hw_instance(self, pool: list[Any], kind: str | None) -> Any:
        """The hardware-engine instance for a call of ``kind``: the least recently used of those whose
        last call was of the same kind or that have not been used, else the least recently used of
        all. An instance whose call's kind differs from its last call's decodes at about half speed
        (8,300-9,100 images/s against 13,800-16,000, the engine alone; docs/engine.md),
        so each kind keeps its instances (with as many kinds as instances, one each); a kind alone
        (a set all 4:2:0) still has its calls alternate over every instance, as taking turns gave."""
        self._hw_turn += 1
        last = self._hw_last
        first = pool[: self._hw_first]
        fits = [d for d in first if id(d) not in last or last[id(d)][0] == kind]
        if not fits:  # a spare: one unused or of this kind
            fits = [d for d in pool[len(first):] if id(d) not in last or last[id(d)][0] == kind]
        pick = min(fits or pool, key=lambda d: last.get(id(d), (None, -1))[1])
        last[id(pick)] = (kind, self._hw_turn)
        return pick
