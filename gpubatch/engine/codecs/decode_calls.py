"""The decode calls of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder`'s threads (a mixin): each
decoder's part of a batch decoded in one or more calls, each call's images posted on the batch's result with
the decode's end event, the part's end after them, and what the hardware engine failed handed to the CUDA
decoder's thread.

On the hardware engine's direct path with a native driver (:mod:`.hw_native`; ``settings.hw_native``) a part is
made in two steps in two threads. The hardware engine's thread queues its calls on the driver (the instance, its
output places and events chosen, nothing waited for but a ring slot) and goes on to the next part at once; the
finishing thread (``gpubatch-hw-finish``) waits for each call's end in turn and posts its images. So the engine's
calls follow one another in the driver's thread, and no wait of a Python thread for the GIL comes between them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..gpu.context import held_event, record_again
from .decode_buffers import _Chunk, _Closed, _Job, _Release
from .nvjpeg_hw import OUTPUT_RGBI, OUTPUT_YUV, NvjpegError


def _post(sink: Any, msg: tuple) -> None:
    """Put ``msg`` on the queue of the DecodeResult ``sink`` refers to; dropped (freeing what it owns)
    where the result is gone or there is none."""
    res = sink() if sink is not None else None
    if res is not None:
        res.feed.put(msg)


@dataclass
class _Queued:
    """What the finishing thread keeps of a part whose calls a native driver makes (:meth:`DecodeCalls._queue_calls`)."""

    t0: float  # when the part's queueing began
    done: list = field(default_factory=list)  # (item, decoded) not posted yet (a whole part's, until its end)
    retry: list = field(default_factory=list)  # what the hardware engine failed
    event: Any = None  # a whole part's: its last call's end event (recorded by the driver), or None: record it then
    failed: bool = False  # a call raised (posted as the part's error): the rest is dropped


class DecodeCalls:
    """The decode-call part of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder` (a mixin: the decoder's
    state is the instance's; ``_driver`` and ``_hw_finish`` are its native driver and finishing thread, or None)."""

    def _run(self, job: _Job, blobs: list[Any], regions: list | None, kinds: list[str | None]) -> None:
        """Decode a prepared part of a batch with the hardware engine (``job.hw``: one call per list, that
        is per kind or chunk, taking turns over the instances) or the CUDA decoder; runs in that
        decoder's thread. Posts on the batch's result (``job.sink``) the images of each call (chunks) or
        of the whole part, then the part's end; what the hardware engine failed then goes to the CUDA
        decoder's thread as a part of its own. With a native driver the direct path's part is queued here
        and finished in the finishing thread (:meth:`_finish_call`, :meth:`_finish_part`)."""
        if job.direct and self._driver is not None:
            try:
                self._queue_calls(job, kinds, blobs, regions)
            except _Closed:
                return
            except BaseException as e:  # the consumer raises it
                _post(job.sink, ("error", e))
                raise
            return
        try:
            retry = self._calls(job, kinds)
        except _Closed:
            return
        except BaseException as e:  # the consumer raises it
            _post(job.sink, ("error", e))
            raise
        finally:
            self.lib.destroy(list(job.streams.values()), list(job.images.values()))
        self._end_part(job, retry, blobs, regions, kinds)

    def _end_part(self, job: _Job, retry: list[int], blobs: list[Any], regions: list | None,
                  kinds: list[str | None]) -> None:
        """Post a part's end, then hand what the hardware engine failed (``retry``) to the CUDA decoder."""
        job.part.retried = int(bool(retry))
        _post(job.sink, ("end", job.part))  # before the retry can post its own end
        if retry:  # what the hardware engine refused or failed, once more on the CUDA decoder
            again = self._prepare(False, blobs, regions, [retry], job.consumer)
            again.sink = job.sink
            self._cuda_thread.submit(self._run, again, blobs, regions, kinds)

    def _calls(self, job: _Job, kinds: list[str | None]) -> list[int]:
        """The decode calls of :meth:`_run`; returns what the hardware engine failed."""
        cp, part, streams, images = self.cp, job.part, job.streams, job.images
        t0 = time.perf_counter()
        done: list[tuple[int, bool]] = []
        retry: list[int] = []
        with cp.cuda.Device(self.device_index):
            self._begin_part(job, kinds)
            for k, idx in enumerate(job.lists):  # (each call's items with places: _prepare)
                if not idx:
                    continue
                owner, args = self._call_place(job, k, idx)
                if job.direct:
                    dec, fmt, parts = self._direct_call(job, idx, kinds)
                    self._stream_before_call(job.stream)
                    t_call, c_call, w_call = time.perf_counter(), time.thread_time(), dec.waited
                    try:
                        dec.decode([job.sources[i] for i in idx], [job.outputs[i] for i in idx], job.stream, fmt,
                                   regions=parts, args=args)
                        ok = [True] * len(idx)
                    except NvjpegError:  # the call failed as a whole (a corrupt image fails its call)
                        ok = [False] * len(idx)
                    self._hw_call_seconds(dec, time.perf_counter() - t_call)
                    self.timings["hw_nvjpeg_cpu"] += time.thread_time() - c_call
                    self.timings["hw_gpu_wait"] += dec.waited - w_call
                    part.hw += sum(ok)
                    retry.extend(self._learn(kinds, idx, ok))
                elif job.hw:
                    dec = self._hw_instance(self.hw_cs, kinds[idx[0]])
                    ok = dec.finish(dec.start([streams[i] for i in idx], [images[i] for i in idx]))
                    part.hw += sum(ok)
                    retry.extend(self._learn(kinds, idx, ok))
                else:
                    ok = self.cuda_c.finish(self.cuda_c.start([streams[i] for i in idx], [images[i] for i in idx]))
                done.extend(zip(idx, ok))
                if owner is not None:
                    self._publish(job, done, owner)
                    done, owner = [], None
            if not job.slots:  # the whole part in one buffer
                self._publish(job, done, self._part_owner(job))
        if not job.warm:
            self.timings["hw" if job.hw else "cuda"] += time.perf_counter() - t0
        return retry

    def _stream_before_call(self, stream: Any) -> None:
        """(Measurement, the direct path from Python, with ``settings.hw_stream_wait``.) Count a call whose stream
        has work pending (``hw_calls_behind``) and wait for that work here, outside nvJPEG's call
        (``hw_stream_wait``), so that the call's own time (``hw_nvjpeg``) no longer holds it. Off, the calls make
        no query of their stream (a CUDA call that lets the GIL go, in the engine's busiest thread)."""
        if self.settings.hw_stream_wait and not stream.done:
            self.timings["hw_calls_behind"] += 1
            t0 = time.perf_counter()
            stream.synchronize()
            self.timings["hw_stream_wait"] += time.perf_counter() - t0

    def _begin_part(self, job: _Job, kinds: list[str | None]) -> None:
        """(A decoder's thread, before a part's calls.) The hardware instances the worker's start has made since,
        and one more a kind where the part needs it (made on this device, by the thread that calls them)."""
        if job.direct and self._hw_coming and not self._warming:
            self._adopt_hw()
        if job.hw and self.grow_hw:
            self._enough_hw(len({kinds[idx[0]] for idx in job.lists if idx}))

    def _call_place(self, job: _Job, k: int, idx: list[int]) -> tuple[Any, Any]:
        """(owner of the call's images or None, its nvJPEG arrays or None) for call ``k`` of ``job``: a chunk goes into
        its ring slot, or a buffer of its own where the slot is not given back in time (new places: new arrays)."""
        owner = None
        args = job.args[k] if job.args else None
        if job.slots:
            owner = self._take_slot(job, k)
            if owner is None:
                owner, args = self._own_buffer(job, idx), None
        return owner, args

    def _direct_call(self, job: _Job, idx: list[int], kinds: list[str | None]) -> tuple[Any, int, list | None]:
        """(instance, output format, regions or None) of a direct-path call of the items ``idx`` (a call is one
        kind)."""
        dec = self._hw_instance(self.hw_direct, kinds[idx[0]])
        fmt = OUTPUT_YUV if idx[0] in job.planes else OUTPUT_RGBI
        return dec, fmt, [job.regions.get(i) for i in idx] if job.regions else None

    def _hw_call_seconds(self, dec: Any, seconds: float) -> None:
        """Count a direct call's seconds (``hw_nvjpeg``; an instance's first call after the warm-up also as
        ``hw_first_calls``)."""
        self.timings["hw_nvjpeg"] += seconds
        if self._cold and id(dec) in self._cold:  # an instance taken after the warm-up: its first call
            self._cold.discard(id(dec))
            self.timings["hw_first_calls"] += seconds

    def _part_owner(self, job: _Job) -> Any:
        """What owns a whole part's buffer once its images are posted."""
        slab = job.slab
        return slab if self.stream_ordered else _Release([slab], job.consumer, self._freed)

    def _queue_calls(self, job: _Job, kinds: list[str | None], blobs: list[Any], regions: list | None) -> None:
        """(The hardware engine's thread, a native driver.) Queue a direct part's calls on the driver, as
        :meth:`_calls` makes them, each handed to the finishing thread as soon as it is queued (a later call
        may wait for a ring slot that only an earlier call's images, once posted and read, give back), then
        the part's end."""
        part = _Queued(time.perf_counter())
        finish = self._hw_finish.submit
        with self.cp.cuda.Device(self.device_index):
            self._begin_part(job, kinds)
            last = max((k for k, idx in enumerate(job.lists) if idx), default=-1)
            for k, idx in enumerate(job.lists):
                if not idx:
                    continue
                owner, args = self._call_place(job, k, idx)
                event = None
                if owner is not None:
                    event = self._call_event(owner)
                elif k == last:  # (the whole part's images go with the last call's end)
                    event = held_event(self.cp)
                dec, fmt, parts = self._direct_call(job, idx, kinds)
                t1 = time.perf_counter()
                try:
                    pending = dec.submit(self._driver, [job.sources[i] for i in idx], [job.outputs[i] for i in idx],
                                         job.stream, fmt, regions=parts, args=args, publish=event)
                except NvjpegError:  # (a region's parameters refused: the call fails as a whole)
                    pending = None
                self.timings["hw_queue"] += time.perf_counter() - t1
                finish(self._finish_call, job, part, (pending, idx, owner, event, dec, k == last), kinds)
        finish(self._finish_part, job, part, blobs, regions, kinds)

    def _finish_call(self, job: _Job, part: _Queued, call: tuple, kinds: list[str | None]) -> None:
        """(The finishing thread.) Wait for a queued call and post its images (a chunk's), or keep them for the
        part's end (a whole part's)."""
        if part.failed:
            return
        pending, idx, owner, event, dec, last = call
        try:
            with self.cp.cuda.Device(self.device_index):
                ok_all, seconds = dec.finish(pending) if pending is not None else (False, 0.0)
                if pending is not None:
                    self._hw_call_seconds(dec, seconds)
                    self.timings["hw_gpu_wait"] += pending.call.wait_ns / 1e9
                ok = [ok_all] * len(idx)
                job.part.hw += sum(ok)
                part.retry.extend(self._learn(kinds, idx, ok))
                part.done.extend(zip(idx, ok))
                if owner is not None:
                    self._publish(job, part.done, owner, None if pending is None else event)
                    part.done = []
                elif last:
                    part.event = None if pending is None else event
        except BaseException as e:  # the consumer raises it
            part.failed = True
            _post(job.sink, ("error", e))
            raise

    def _finish_part(self, job: _Job, part: _Queued, blobs: list[Any], regions: list | None,
                     kinds: list[str | None]) -> None:
        """(The finishing thread.) A part's end once its calls are finished, as :meth:`_run` ends a part."""
        if part.failed:
            return
        try:
            if not job.slots:
                with self.cp.cuda.Device(self.device_index):
                    self._publish(job, part.done, self._part_owner(job), part.event)
        except BaseException as e:  # the consumer raises it
            _post(job.sink, ("error", e))
            raise
        self.timings["hw"] += time.perf_counter() - part.t0
        self._end_part(job, part.retry, blobs, regions, kinds)

    def _call_event(self, owner: Any) -> Any:
        """The event a call's images are posted with, not yet recorded: a ring slot's own (made once), else a
        new one."""
        if isinstance(owner, _Chunk):
            slot = owner.slot
            if slot.decoded is None:
                slot.decoded = held_event(self.cp)
            return slot.decoded
        return held_event(self.cp)

    def _publish(self, job: _Job, done: list[tuple[int, bool]], owner: Any, event: Any = None) -> None:
        """Post the images of ``done`` (item, decoded) in ``owner``'s memory with the decode's end event
        (``event``, recorded already by a native driver; else recorded here); what the CUDA decoder failed
        goes to the CPU."""
        if event is None:
            if isinstance(owner, _Chunk):  # (its slot's event, recorded again: the slot's next call comes after
                slot = owner.slot            # the consumer has waited for this one and dropped the chunk)
                event = slot.decoded = record_again(slot.decoded, job.stream, self.cp)
            else:  # (a new event a finalizer can tell is gone: the part's memory goes with this owner)
                event = record_again(None, job.stream, self.cp)
        if not isinstance(owner, _Release):
            owner.event = event  # until the consumer waits for it
        views = []  # (item, address, shape, row pitch, sampling): the consumer makes the DeviceImages (_gather)
        for i, good in done:
            if good:
                ptr, shape, row = job.views[i]
                if i in job.crops:  # (interleaved RGB)
                    y0, x0, y1, x1 = job.crops[i]
                    ptr, shape = ptr + y0 * row + x0 * 3, (y1 - y0, x1 - x0, 3)
                views.append((i, ptr, shape, row, job.planes.get(i)))
            elif not job.hw:
                job.part.failed.append(i)
        _post(job.sink, ("images", views, owner, event, job.hw))
