#!/usr/bin/env python3
"""The GPU audio unit's hand-over to its shards' writer, with the GPU's part of each batch stood in by a wait: the
loop's time blocked in the hand-over, the writer's idle time, and the whole run's, for the two ways the unit has handed
a shard's part of a batch over: entry by entry (``--by entry``, the unit before 2026-12-05's change: one item a
record through the writer's queue of 8) and in one go a shard (``--by shard``, :func:`gpubatch.engine.gpu.audio.by_shard`).

    python3 benchmarks/audio_handover.py [--clips 2048] [--shard 128] [--chain-ms 60] [--sync shard] [--repeats 3]

What is real: the writer (``execute.worker.ShardWriter``: a thread, its committer's thread, the journal), the
webdataset sink and its files (``--sync`` as the command takes it), the features' encoding into ``.npy``
(``gpu.audio._encoded_timed``: 80 x 3,000 float16, a 30-s Whisper clip's 480 KB) and the loop's hand-over code. What
is stood in: a batch's decode wait, its chain on the GPU and its copy back, by ``--chain-ms`` of sleep a batch (the
GIL released, as it is while the GPU works and the loop waits on it; on an H200 host the loop spent 60 ms a batch of
128 clips on them, 2026-12-05: ``chain`` 38 ms, ``decode_wait`` 22 ms). One process, one loop: a GPU process's.
Each run writes into a fresh folder under ``--tmp`` (removed after it). Prints, for each way, the median run's
seconds and clips/s, and the loop's ``hand_over`` and the writer's ``writer_idle`` summed over the shards.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_run(args: argparse.Namespace, by: str, root: Path) -> dict:
    import numpy as np

    from gpubatch._commit import set_sync
    from gpubatch.engine.codecs.audio_io import AudioData
    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.execute.worker import RunContext, ShardWriter, ShardWriting
    from gpubatch.engine.gpu.audio import _encoded_timed, by_shard
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.run import Job
    from gpubatch.formats import get_format
    from gpubatch.formats.base import WriteOptions
    from gpubatch.runner import _sink
    from gpubatch.types import DatasetInfo, Media, Record, ShardTask

    set_sync(args.sync)
    fmt = get_format("webdataset")
    n_shards = -(-args.clips // args.shard)
    tasks = [ShardTask(k, k * args.shard, min(args.clips, (k + 1) * args.shard),
                       fmt.shard_names(n_shards, WriteOptions())[k]) for k in range(n_shards)]
    stage = root / "stage"
    stage.mkdir(parents=True)
    ctx = RunContext(opener=None, sink=functools.partial(_sink, fmt, stage, DatasetInfo(), WriteOptions(), False),
                     plan=Plan(), device=Device(DeviceKind.CPU), stage=stage)
    rng = np.random.default_rng(0)
    features = rng.standard_normal((8, 80, 3000)).astype(np.float16)  # (8 arrays of a clip's features, taken in turn)
    plan = ctx.plan
    done: list = []
    writer = ShardWriter(done.append)
    hand_over = 0.0
    t0 = time.perf_counter()
    for task in tasks:
        shard = ShardWriting(task, ctx)
        time.sleep(args.chain_ms / 1000)  # (the batch's decode wait, chain and copy back: the GIL released)
        group = []
        for i in range(task.start, task.stop):
            job = Job(0, Record(key=f"clip_{i:05d}", data=b"", media=Media.AUDIO, codec="flac"), params=[])
            group.append((shard, [(job, AudioData(features[i % 8], 16000, features="log_mel"))], i == task.stop - 1))
        parts = by_shard(group) if by == "shard" else group
        for w, items, last in parts:
            t = time.perf_counter()
            writer.put(w, functools.partial(_encoded_timed, list(items), plan))
            if last:
                writer.commit(w, {}, None)
            hand_over += time.perf_counter() - t
    writer.close()
    seconds = time.perf_counter() - t0
    assert len(done) == n_shards and sum(r.counts["records_out"] for r in done) == args.clips
    idle = sum(r.timings.get("writer_idle", 0.0) for r in done)
    return {"seconds": round(seconds, 3), "hand_over": round(hand_over, 3), "writer_idle": round(idle, 3),
            "write": round(sum(r.timings.get("write", 0.0) for r in done), 3),
            "encode": round(sum(r.timings.get("encode", 0.0) for r in done), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=2048)
    ap.add_argument("--shard", type=int, default=128, help="clips a shard (a batch: the unit's batches never span two)")
    ap.add_argument("--chain-ms", type=float, default=60.0, help="the GPU's part of a batch, stood in by a sleep")
    ap.add_argument("--sync", default="shard", choices=["shard", "end", "off"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="where the runs write (default: the system's temporary folder)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict = {"clips": args.clips, "shard": args.shard, "chain_ms": args.chain_ms, "sync": args.sync, "ways": {}}
    runs: dict[str, list] = {"entry": [], "shard": []}
    for _ in range(args.repeats):  # (the two ways in turn: the machine's drift falls on both alike)
        for by in runs:
            root = Path(tempfile.mkdtemp(prefix="gpubatch-handover-", dir=args.tmp))
            try:
                runs[by].append(one_run(args, by, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
    for by, rs in runs.items():
        med = sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2]
        out["ways"][by] = {"clips_per_s": round(args.clips / med["seconds"], 1), "median_run": med,
                           "seconds": [r["seconds"] for r in rs]}
        print(f"by {by:5s}: {out['ways'][by]['clips_per_s']:8.1f} clips/s  runs {[r['seconds'] for r in rs]}  "
              f"hand_over {med['hand_over']} s  writer_idle {med['writer_idle']} s  write {med['write']} s  "
              f"encode {med['encode']} s  (median run)")
    out["ratio_shard_to_entry"] = round(statistics.median(runs["entry"][i]["seconds"] for i in range(args.repeats))
                                        / statistics.median(runs["shard"][i]["seconds"] for i in range(args.repeats)), 3)
    print(f"by shard / by entry: {out['ratio_shard_to_entry']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
