"""A batch's encoded bytes as a feed hands them over in views mode (:class:`~.feed.Feed`): views of one slot of
its shared-memory ring, made when asked for, and every item's host address at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class SlotViews(Sequence):
    """A batch's encoded bytes in a slot of a feed's ring, as a sequence of NumPy uint8 views made when asked
    for (``b""`` for an item with no bytes), and all their host addresses in one call (:meth:`addresses`): the
    GPU decoder's preparation then takes no ctypes object an image (``decode_buffers._host_address`` had been
    the prefetch thread's largest GIL holder in a loader's process, 11% of the samples holding it: py-spy,
    H200, 2026-12-03). It holds one view of the whole slot, which keeps the ring mapped while it lives."""

    __slots__ = ("slot", "offsets", "lengths")

    def __init__(self, buf: Any, base: int, size: int, offsets: Sequence[int], lengths: Sequence[int]):
        self.slot = np.frombuffer(buf, np.uint8, size, base)
        self.offsets, self.lengths = list(offsets), list(lengths)  # (within the slot, as the feed's reader wrote them)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a, n = self.offsets[i], self.lengths[i]
        return self.slot[a : a + n] if n else b""

    def addresses(self) -> tuple[list[int], list[int]]:
        """(host address, size) of every item, as two lists."""
        base = self.slot.ctypes.data
        return [base + a for a in self.offsets], self.lengths

    def jpeg_ended(self) -> list[bool]:
        """Per item, whether its bytes end with a JPEG's end marker (FF D9)."""
        n = np.asarray(self.lengths, np.int64)
        ok = n >= 2
        ends = np.where(ok, np.asarray(self.offsets, np.int64) + n, 2)
        return (ok & (self.slot[ends - 2] == 0xFF) & (self.slot[ends - 1] == 0xD9)).tolist()
