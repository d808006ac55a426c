"""How the GPU image decoder splits each batch between its two JPEG decoders (the decode route), and
how the route follows the load on the host while a run goes: the routing part of
:class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder`.

The hardware JPEG engine costs its host thread about 0.03-0.05 ms an image, the CUDA decoder (Huffman
on the GPU) about 1 ms of CPU: the "split" route gives the CUDA decoder a share of each batch where the
host has cores to spare, the "hardware" route gives the engine every kind it decodes.
"""

from __future__ import annotations

import warnings

from ...errors import UsageError
from ..settings import HW_KINDS, ROUTES, Settings

# The CUDA decoder's host cost per image, cheapest kind first: its Huffman host phase works on the
# coded data, which 4:4:4 has about twice as much of as 4:2:0 at the same size and quality (4:2:0
# 420-600 us an image, 4:4:4 750-990 us; docs/engine.md).
_CUDA_CHEAP = ("baseline/gray", "baseline/4:2:0", "baseline/4:2:2", "baseline/4:4:0", "baseline/4:4:4")


def choose_route(route: str | None, cores: float | None, share: int, settings: Settings) -> tuple[str, float | None]:
    """(the route, the free cores it was chosen by or None): ``route`` (by default the settings')
    as given, or for "auto" by ``cores`` free (by default measured now,
    :func:`~gpubatch.engine.gpu.affinity.free_cores`, split between ``share`` engines): "split" from
    ``settings.split_min_cores`` free cores, else "hardware"."""
    route = route or settings.decode_route
    if route not in ROUTES:
        raise UsageError(f"unknown decode route {route!r}: one of {', '.join(ROUTES)}")
    if route != "auto":
        return route, None
    if cores is None:
        from ..gpu.affinity import free_cores

        cores = free_cores() / max(share, 1)
    return ("split" if cores >= settings.split_min_cores else "hardware"), round(cores, 1)


def _cuda_cost(kind: str) -> int:
    return _CUDA_CHEAP.index(kind) if kind in _CUDA_CHEAP else len(_CUDA_CHEAP)


class DecodeRouting:
    """The routing part of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder` (a mixin: the
    decoder's state, its ``settings`` among it, is the instance's)."""

    def _split(self, groups: dict[str, list[int]]) -> tuple[list[list[int]], list[int]]:
        """(per-kind index lists for the hardware engine, indices for the CUDA decoder): the CUDA
        decoder gets ``cuda_share`` of the batch, the kinds the hardware engine is slowest on first.
        The split depends only on the batch's contents, so a fixed share routes a given batch the
        same way every time."""
        if self.hw is None and not self.hw_cs and not self.hw_direct:
            return [], sorted(i for idx in groups.values() for i in idx)
        given = self.settings.cuda_kinds  # (the kinds every route gives the CUDA decoder, by their header)
        hw_kinds = [k for k in HW_KINDS if k in groups  # (those it decodes fastest first)
                     and k not in self.hw_refuses and k not in given]
        cuda = [i for k, idx in groups.items() if k not in hw_kinds for i in idx]
        total = sum(len(v) for v in groups.values())
        want = int(round(self.cuda_share * total)) - len(cuda)
        hw_lists = {k: list(groups[k]) for k in hw_kinds}
        # the hardware engine's slowest kinds first, or the CUDA decoder's cheapest
        order = reversed(hw_kinds) if self.cuda_takes == "slowest" else sorted(hw_kinds, key=_cuda_cost)
        for k in order:
            if want <= 0:
                break
            lst = hw_lists[k]
            take = min(want, len(lst))
            cuda.extend(lst[len(lst) - take :])
            del lst[len(lst) - take :]
            want -= take
        hw_lists = [lst for lst in hw_lists.values() if lst]
        if self.settings.hw_mixed and hw_lists:
            hw_lists = [sorted(i for lst in hw_lists for i in lst)]
        return hw_lists, sorted(cuda)

    def _adapt(self, t_hw: float, t_cuda: float) -> None:
        if self.deterministic or t_hw <= 0 or t_cuda <= 0:
            return
        self.cuda_share += self._step if t_hw > t_cuda else -self._step
        self.cuda_share = min(0.95, max(0.05, self.cuda_share))
        self._step = max(0.01, self._step * 0.8)

    def _follow(self, now: float) -> None:
        """A check of the load (every ``settings.follow_check_s`` seconds, in the thread handing
        batches over): the route the follower gives from now on. The hardware route gets an instance
        per common kind (``settings.hw_only_instances``), made the first time it is taken; back on the
        split route the extra ones are spares (:meth:`_hw_instance`)."""
        self._next_check = now + self.settings.follow_check_s
        others = self._probe.take().get("others")
        if others is None:  # /proc/stat unreadable: the route stays
            self.follower = None
            return
        route = self.follower.observe(others, now - self._t0)
        if route == self.route:
            return
        pool = self.hw_direct or self.hw_cs
        wanted = self.settings.hw_only_instances
        if route == "hardware" and len(pool) < wanted:
            try:
                self._more_hw(wanted - len(pool), bool(self.hw_direct))
            except Exception as e:  # (the instances there are enough to decode with)
                warnings.warn(f"no more hardware-engine instances ({e})", RuntimeWarning, stacklevel=2)
        self._hw_first = len(pool) if route == "hardware" else self.HW_INSTANCES
        self.route, self.cuda_share = route, (0.0 if route == "hardware" else self.settings.cuda_share)
        # Every chunk buffer of both decoders is given back before the next batch is prepared, and the
        # new route's calls make theirs at their own sizes (freeing only the buffers the new route has no
        # calls for left the pool fragmented: a peak of 865-905 MiB against 809-815; docs/engine.md).
        self._give_back_slots()

    def _learn(self, kinds: list[str | None], hw_idx: list[int], ok: list[bool]) -> list[int]:
        """Note which kinds the hardware engine takes; returns the indices it failed (to retry)."""
        retry = []
        taken: dict[str, bool] = {}
        for i, good in zip(hw_idx, ok):
            if good:
                taken[kinds[i]] = True
            else:
                retry.append(i)
                taken.setdefault(kinds[i], False)
        for kind, good in taken.items():  # (under ``_calling``) a kind decoded even once is not refused
            if good:                          # for a corrupt file
                self.hw_takes.add(kind)
            elif kind not in self.hw_takes:
                self.hw_refuses.add(kind)
        return retry
