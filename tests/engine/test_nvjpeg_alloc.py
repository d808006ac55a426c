"""The stream-ordered allocators for nvJPEG's handles (``codecs/nvjpeg_alloc.py``), on the CPU: a fake CUDA
driver stands in for libcuda, so that what the callbacks do with the blocks is checked without a GPU (their
use by nvJPEG is a GPU test: ``test_nvjpeg_binding_decodes_regions_and_planes``)."""

from __future__ import annotations

import ctypes as C

import pytest

from gpubatch.engine.codecs import nvjpeg_alloc


class FakeDriver:
    """cuMemHostAlloc hands out numbered blocks; an event is done once ``ended`` holds it."""

    def __init__(self) -> None:
        self.next_block, self.next_event = 0x1000, 1
        self.ended: set[int] = set()
        self.recorded: dict[int, int] = {}  # event -> stream
        self.destroyed: list[int] = []
        self.device: list[tuple[str, int, int]] = []

    def cuMemHostAlloc(self, out, size, flags):  # noqa: N802 (the driver's names)
        out._obj.value = self.next_block
        self.next_block += 0x1000
        return 0

    def cuEventCreate(self, out, flags):  # noqa: N802
        out._obj.value = self.next_event
        self.next_event += 1
        return 0

    def cuEventRecord(self, event, stream):  # noqa: N802
        self.recorded[event] = stream
        return 0

    def cuEventQuery(self, event):  # noqa: N802
        return 0 if event in self.ended else 600  # CUDA_ERROR_NOT_READY

    def cuEventDestroy_v2(self, event):  # noqa: N802
        self.destroyed.append(event)
        return 0

    def cuMemAllocAsync(self, out, size, stream):  # noqa: N802
        out._obj.value = 0x7000 + size
        self.device.append(("alloc", size, stream))
        return 0

    def cuMemFreeAsync(self, ptr, stream):  # noqa: N802
        self.device.append(("free", ptr, stream))
        return 0


@pytest.fixture
def fake(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(nvjpeg_alloc, "_driver", lambda: driver)
    return driver


def test_a_pinned_block_is_reused_only_once_the_work_before_its_free_has_ended(fake):
    a = nvjpeg_alloc.StreamAllocators()
    out = [None]
    assert a._pinned_malloc(None, out, 100, 7) == 0
    first = out[0]
    assert a._pinned_free(None, first, 100, 7) == 0
    (event,) = fake.recorded
    assert fake.recorded[event] == 7  # (recorded on the stream nvJPEG freed it on)
    a._pinned_malloc(None, out, 50, 7)
    assert out[0] != first  # its free's work has not ended: a new block
    fake.ended.add(event)
    a._pinned_malloc(None, out, 80, 7)
    assert out[0] == first and fake.destroyed == [event]  # now reused, its event destroyed
    assert a.counts["pinned_reused"] == 1 and a.counts["pinned_malloc"] == 3 and a.counts["pinned_free"] == 1


def test_the_smallest_free_block_that_fits_is_taken_and_none_too_small(fake):
    a = nvjpeg_alloc.StreamAllocators()
    out, blocks = [None], {}
    for size in (300, 100, 200):
        a._pinned_malloc(None, out, size, 0)
        blocks[size] = out[0]
    for size, block in blocks.items():
        a._pinned_free(None, block, size, 0)
    fake.ended.update(fake.recorded)
    a._pinned_malloc(None, out, 150, 0)
    assert out[0] == blocks[200]
    a._pinned_malloc(None, out, 400, 0)  # (none large enough: a new one)
    assert out[0] not in blocks.values()
    a._pinned_malloc(None, out, 100, 0)
    assert out[0] == blocks[100]


def test_device_memory_is_stream_ordered_on_the_stream_nvjpeg_names(fake):
    a = nvjpeg_alloc.StreamAllocators()
    out = [None]
    assert a._dev_malloc(None, out, 4096, 5) == 0 and out[0] == 0x7000 + 4096
    assert a._dev_free(None, out[0], 4096, 5) == 0
    assert fake.device == [("alloc", 4096, 5), ("free", 0x7000 + 4096, 5)]
    assert a.total() == 2


def test_the_callbacks_fill_the_structures_nvjpeg_takes():
    a = nvjpeg_alloc.StreamAllocators()
    assert C.sizeof(a.dev) == C.sizeof(a.pinned) == 3 * C.sizeof(C.c_void_p)
    assert a.dev.dev_malloc and a.dev.dev_free and a.pinned.pinned_malloc and a.pinned.pinned_free
