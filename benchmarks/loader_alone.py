#!/usr/bin/env python3
"""The training loader alone in this process, for a profiler that follows one process (py-spy): the bench's
``resnet50`` chain over a dataset gpubatch wrote, one untimed epoch, then ``--seconds`` of batches.

    py-spy record --native --threads --idle -r 100 -f raw -o RAW -- python3 benchmarks/loader_alone.py --data DATASET
    python3 benchmarks/pyspy_threads.py RAW --thread hw-decode

``gpubatch bench --data`` runs each contender in a process of its own, which py-spy's native mode does not follow.
``--contender dali-reader`` runs DALI's reader of the dataset's format instead (the bench's, with its chain: one
pass over the data untimed, then ``--seconds`` of batches), for ``benchmarks/ab_loader.py --dali``.
"""

from __future__ import annotations

import argparse
import time


def tree_cpu_seconds() -> float | None:
    """CPU seconds of this process and every live process under it (the loader's readers), from /proc; None
    where there is no /proc."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    try:
        stats = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as fh:
                        f = fh.read().rsplit(")", 1)[1].split()
                except OSError:  # (a process gone meanwhile)
                    continue
                stats[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)  # (parent, utime + stime)
    except OSError:
        return None
    mine, grew = {os.getpid()}, True
    while grew:
        grew = False
        for pid, (ppid, _) in stats.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(stats[p][1] for p in mine if p in stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a dataset gpubatch wrote (webdataset shards, say)")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--chain", default="train", choices=("train", "val"))
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line (benchmarks/ab_loader.py)")
    ap.add_argument("--contender", default="loader", choices=("loader", "dali-reader"))
    args = ap.parse_args()
    if args.contender == "dali-reader":
        import json

        from gpubatch.bench.loader import dataset_source, run_dali_reader

        src = dataset_source(args.data)
        if src is None:
            raise SystemExit(f"loader_alone: {args.data} is not a dataset gpubatch wrote")
        res = run_dali_reader({"data": args.data, "format": src["format"], "images": src["images"], "model": "resnet50",
                               "chain": args.chain, "batch_size": args.batch_size, "seconds": args.seconds})
        if "skipped" in res:
            raise SystemExit(f"loader_alone: DALI's reader: {res['skipped']}")
        print(json.dumps({"images_per_s": res["images_per_s"], "images": res.get("images"), "seconds": res.get("seconds"),
                          "decode_wait": None, "gpu_memory_mib": int((res.get("gpu_mem_gib") or 0) * 1024),
                          "reader": res.get("reader")}))
        return

    from gpubatch.bench import chain_ops, get_model
    from gpubatch.training import Loader

    mem = None
    if args.json and args.device == "gpu":
        from gpubatch.engine.gpu.memory import ProcessMemory

        mem = ProcessMemory().start()  # (this process's device memory, sampled: its peak)
    dl = Loader(args.data, chain_ops(get_model("resnet50").chains[args.chain]), batch_size=args.batch_size,
                device=args.device, seed=0, keys=("image", "label"))
    for _ in dl:  # the untimed epoch
        pass
    n, epoch, t0, cpu0 = 0, 1, time.perf_counter(), tree_cpu_seconds()
    while time.perf_counter() - t0 < args.seconds:
        dl.set_epoch(epoch)
        for _, labels in dl:
            n += len(labels)
            if time.perf_counter() - t0 >= args.seconds:
                break
        epoch += 1
    took = time.perf_counter() - t0
    cpu1 = tree_cpu_seconds()
    cores = round((cpu1 - cpu0) / took, 2) if cpu0 is not None and cpu1 is not None else None
    if args.json:
        import json

        timings = dict(getattr(dl._pipe, "timings", None) or {})  # (the image pipeline's stage times, all epochs)
        peak = mem.stop() if mem is not None else 0
        print(json.dumps({"images_per_s": n / took, "images": n, "seconds": took,
                          "decode_wait": timings.get("decode_wait"), "gpu_memory_mib": peak >> 20, "cpu_cores": cores}))
        return
    print(f"loader_alone: {n / took:.0f} images/s over {took:.1f} s ({n} images; {cores} CPU cores)")


if __name__ == "__main__":
    main()
