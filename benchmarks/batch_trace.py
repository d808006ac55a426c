#!/usr/bin/env python3
"""Which stage each batch waits for: a host-side timeline of the GPU path's threads, batch by batch.

    python3 benchmarks/batch_trace.py [--chain train|val] [--seconds 2] [--images 4096] [--share 0.35]
        [--chunk N] [--hw-chunk N] [--json summary.json] [--trace trace.json]

The ResNet-50 training or validation chain runs as ``memory_study`` runs it (``iterate_files``, batch
256, the engine's stream synchronized after every batch, after one untimed pass over the set). For
``--seconds`` the engine's own methods are timed from outside, tagged with the batch they work on:

- ``handover``: ``GpuImageDecoder.decode`` in the decode thread (header split, code streams, output
  descriptors, the parts handed to the decoders' threads);
- ``hw`` / ``cuda``: each decoder's part of a batch in its thread (``_run``), of which
  ``hw_slot`` / ``cuda_slot`` the waits for a chunk buffer the consumer still reads;
- ``process``: ``ImagePipeline.process`` in the consumer, of which ``chunk_wait`` is the time it
  waited for the decoders' next chunk; ``next``: the whole ``next()`` of the iterator (``process``
  plus waiting for the decode thread's hand-over); ``sync``: the stream synchronization after it.

Printed: each stage's share of the window (how busy its thread was), and per batch, medians of: how
long each decoder's part waited between its hand-over and its start (a decoder still busy with
earlier batches), how long after its hand-over each part ended, which part ended last, and where the
consumer's time went. A stage whose thread is busy nearly all the time and whose queue delay grows
is the one the others wait for. ``--trace`` writes the spans as a Chrome trace (chrome://tracing,
ui.perfetto.dev). Host time only: the GPU's own work is in ``timeline.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections import defaultdict

from _data import DEFAULT_DATA, jpeg_set, run_beside_busy  # noqa: F401  (benchmarks/_data.py, beside this script)

from gpubatch.bench.contenders import file_keys

SPANS: list[tuple[str, int, float, float, str]] = []  # (stage, batch, start, end, thread)
ON = threading.Event()  # recording only during the traced window


def record(stage: str, seq: int, t0: float, t1: float) -> None:
    if ON.is_set():
        SPANS.append((stage, seq, t0, t1, threading.current_thread().name))


def instrument() -> None:
    """Wrap the engine's stage methods so that each records its span (see the module docstring)."""
    from gpubatch.engine.codecs import image_gpu
    from gpubatch.engine.pipeline import ImagePipeline

    dec_cls, res_cls = image_gpu.GpuImageDecoder, image_gpu.DecodeResult
    local = threading.local()
    counter = iter(range(1 << 62))

    decode = dec_cls.decode

    def traced_decode(self, *a, **k):
        seq = local.seq = next(counter)
        t0 = time.perf_counter()
        res = decode(self, *a, **k)
        record("handover", seq, t0, time.perf_counter())
        res.trace_seq = seq
        return res

    prepare = dec_cls._prepare

    def traced_prepare(self, *a, **k):
        job = prepare(self, *a, **k)
        job.trace_seq = getattr(local, "seq", -1)  # set by decode() in this thread; -1 for a retry's part
        return job

    def spanned(fn, stage, seq_of):
        """``fn(self, obj, ...)`` recording its span as ``stage(obj)`` of batch ``seq_of(obj)``."""

        def traced(self, obj, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(self, obj, *a, **k)
            finally:
                record(stage(obj), seq_of(obj), t0, time.perf_counter())

        return traced

    chunks = res_cls.chunks

    def traced_chunks(self, *a, **k):
        gen = chunks(self, *a, **k)
        seq = getattr(self, "trace_seq", -1)
        while True:
            t0 = time.perf_counter()
            try:
                got = next(gen)
            except StopIteration:
                record("chunk_wait", seq, t0, time.perf_counter())
                return
            record("chunk_wait", seq, t0, time.perf_counter())
            yield got

    def seq_of(obj):
        return getattr(obj, "trace_seq", -1)

    dec_cls.decode, dec_cls._prepare = traced_decode, traced_prepare
    dec_cls._run = spanned(dec_cls._run, lambda job: "hw" if job.hw else "cuda", seq_of)
    dec_cls._take_slot = spanned(dec_cls._take_slot, lambda job: "hw_slot" if job.hw else "cuda_slot", seq_of)
    ImagePipeline.process = spanned(ImagePipeline.process, lambda _: "process", seq_of)
    res_cls.chunks = traced_chunks


def summarize(t_start: float, t_end: float, images: int) -> dict:
    """Stage shares of the window (``images`` came out of it) and per-batch medians (see the module
    docstring)."""
    from gpubatch.bench.measure import percentile

    wall = t_end - t_start
    busy: dict[str, float] = defaultdict(float)
    by_thread: dict[str, float] = defaultdict(float)
    per: dict[int, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    threads: dict[str, set] = defaultdict(set)
    for stage, seq, t0, t1, thread in SPANS:
        a, b = max(t0, t_start), min(t1, t_end)
        if b > a:
            busy[stage] += b - a
            if stage in ("handover", "hw", "cuda", "process"):
                by_thread[thread] += b - a
        threads[stage].add(thread)
        per[seq][stage].append((t0, t1))
    rows: dict[str, list[float]] = defaultdict(list)
    last = defaultdict(int)
    for seq, st in per.items():
        if seq < 0 or not {"handover", "process", "next"} <= set(st):
            continue
        h0, h1 = st["handover"][0]
        for part in ("hw", "cuda"):
            if st.get(part):  # a part's span: from its first call's start to its last call's end
                s0, s1 = min(a for a, _ in st[part]), max(b for _, b in st[part])
                rows[f"{part}: start after hand-over"].append(s0 - h1)
                rows[f"{part}: end after hand-over"].append(s1 - h1)
                rows[f"{part}: length"].append(s1 - s0)
        ends = {part: max(b for _, b in st[part]) for part in ("hw", "cuda") if st.get(part)}
        if ends:
            last[max(ends, key=ends.get)] += 1
        p0, p1 = st["process"][0]
        n0, n1 = st["next"][0]
        rows["consumer: next() before process (waiting for the hand-over)"].append(p0 - n0)
        rows["consumer: process"].append(p1 - p0)
        rows["consumer: of which waiting for chunks"].append(sum(b - a for a, b in st.get("chunk_wait", [])))
        rows["consumer: process start after hand-over end"].append(p0 - h1)
        if st.get("sync"):
            rows["consumer: sync"].append(st["sync"][0][1] - st["sync"][0][0])
        rows["hand-over"].append(h1 - h0)
    batches = sum(1 for seq, st in per.items() if "next" in st and seq >= 0)
    return {
        "window_s": round(wall, 3),
        "batches": batches,
        "images_per_s": round(images / wall) if wall else 0,
        "busy_share": {k: round(v / wall, 3) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])},
        "threads": {k: sorted(v) for k, v in threads.items()},
        "busy_share_by_thread": {k: round(v / wall, 3) for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1])},
        "median_ms": {k: round(1e3 * statistics.median(v), 2) for k, v in rows.items() if v},
        "p90_ms": {k: round(1e3 * percentile(sorted(v), 0.9), 2) for k, v in rows.items() if v},
        "ended_last": dict(last),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", default="train", choices=["train", "val"])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--share", type=float, default=None, help="the CUDA decoder's share of each batch")
    ap.add_argument("--chunk", type=int, default=None,
                    help="ImagePipeline(decode_chunk=N): decode in calls of at most N (0: whole parts)")
    ap.add_argument("--hw-chunk", type=int, default=None, help="the hardware engine's calls split above N (image_gpu.HW_CHUNK)")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--trace", default=None, help="write the spans here as a Chrome trace")
    run_beside_busy(ap, _run)


def _run(args: argparse.Namespace) -> None:
    instrument()
    from gpubatch.bench import chain_ops, get_model
    from gpubatch.engine.pipeline import ImagePipeline

    files = jpeg_set(args.data, args.images)
    if args.hw_chunk is not None:
        from gpubatch.engine.codecs import image_gpu

        image_gpu.HW_CHUNK = args.hw_chunk
    pipe = ImagePipeline(chain_ops(get_model("resnet50").chains[args.chain]), device="gpu", seed=0,
                         decode_chunk=args.chunk)
    if args.share is not None:
        pipe.engine.decoder.cuda_share = args.share
    it = pipe.iterate_files(files, file_keys(files), 256, repeat=True)
    sync = pipe.engine.stream.synchronize
    for _ in range(-(-len(files) // 256)):
        next(it)
    sync()
    ON.set()
    t_start = time.perf_counter()
    images = 0
    while time.perf_counter() - t_start < args.seconds:
        t0 = time.perf_counter()
        images += len(next(it))
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        # the batch's number: the hand-over's, found from the process span just recorded in this thread
        seq = next((s for stage, s, a, b, th in reversed(SPANS) if stage == "process" and a >= t0), -1)
        record("next", seq, t0, t1)
        record("sync", seq, t1, t2)
    t_end = time.perf_counter()
    ON.clear()
    it.close()
    pipe.close()
    summary = summarize(t_start, t_end, images)
    summary.update({"chain": args.chain, "share": args.share if args.share is not None else "default",
                    "chunk": args.chunk, "hw_chunk": args.hw_chunk})
    print(f"{args.chain} chain: {summary['batches']} batches in {summary['window_s']} s "
          f"({summary['images_per_s']:,} images/s, traced)")
    print("busy share of the window per stage (threads):")
    for k, v in summary["busy_share"].items():
        print(f"  {k:12s} {v:6.1%}  {', '.join(summary['threads'][k])}")
    print("busy share per thread (hand-over, decoder parts, process):",
          ", ".join(f"{k} {v:.1%}" for k, v in summary["busy_share_by_thread"].items()))
    print("per batch, median / p90 ms:")
    for k, v in summary["median_ms"].items():
        print(f"  {k:62s} {v:8.2f} / {summary['p90_ms'][k]:8.2f}")
    print(f"part that ended last: {summary['ended_last']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    if args.trace:
        tids: dict[str, int] = {}
        events = [{"name": stage, "ph": "X", "pid": 1, "tid": tids.setdefault(th, len(tids)),
                   "ts": 1e6 * (t0 - t_start), "dur": 1e6 * (t1 - t0), "args": {"batch": s}}
                  for stage, s, t0, t1, th in SPANS]
        events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": th}} for th, i in tids.items()]
        with open(args.trace, "w") as fh:
            json.dump({"traceEvents": events}, fh)


if __name__ == "__main__":
    main()
