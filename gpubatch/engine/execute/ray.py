"""The Ray executor: a run's shard tasks on the actors of a Ray cluster, under the local executor's contract.

The driver (the ``gpubatch`` process) plans the shards and keeps the journal's run file; Ray places one
actor a CPU (CPU runs) or ``--gpu-procs`` actors a GPU (``num_gpus=1/N``; GPU runs), each making its work
unit once, as a local worker process does, and running the shard tasks it is handed: each to a shard
committed (temp name, fsync, rename) and journaled in the destination's staging folder, which every node
must see (a shared file system). Tasks go out as actors free up, one shard at a time, or a few in shard
order where the strategy deals them (the GPU image unit's feed reads ahead across them), each to an
actor once Ray has started it.

An actor lost with its node, or killed, is restarted by Ray and its call retried; the retry skips the
shards the journal already holds, so a shard is written once more at most, to the same name and bytes.
A driver killed mid-run is resumed with ``--resume`` from the same journal. The output never depends on
which actor or node wrote a shard: names and bytes follow from the plan. Ray's own writers and
checkpoints are not used (uuid names, rows committed at least once).

Ray is an optional extra (``pip install 'gpubatch[ray]'``), imported only here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from ..._commit import sync_mode
from ...errors import GpubatchError, RecordFailed, UsageError
from ...types import ShardResult, ShardTask
from .journal import Journal
from .strategies import Strategy
from .worker import RunContext, ShardWriting

#: an actor restarted after its process or node was lost, at most this many times; its call retried as often
RESTARTS = 3
#: a run whose actors the cluster cannot place (too few CPUs or GPUs) stops after this long, saying so
PLACE_TIMEOUT_S = 120.0


def import_ray() -> Any:
    """Ray, or a one-line error naming the extra."""
    try:
        import ray
    except ImportError:
        raise UsageError("the Ray executor needs Ray: pip install 'gpubatch[ray]'") from None
    return ray


class ShardActor:
    """A Ray actor that works shard tasks: its unit made once (a CUDA context, decoders, reader processes
    on a GPU), its reader open; :meth:`run` works a list of tasks to committed, journaled shards."""

    def __init__(self, ctx: RunContext, strategy: Strategy, slot: int, host_procs: int):
        if strategy.gpu:  # Ray gave this actor its GPU as CUDA_VISIBLE_DEVICES: ordinal 0 here
            import ray

            ids = ",".join(str(g) for g in ray.get_gpu_ids())
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            here = ray.get_runtime_context().get_node_id()[:8] + ":" if len(nodes) > 1 else ""
            # (no core kept for the hardware decoder's thread: the actors of a node would all take the same)
            ctx = dataclasses.replace(ctx, device=ctx.device.one(0), host_share=host_procs, gpu_label=here + ids,
                                      settings=ctx.settings.with_(reserve_core=False))
        self.ctx, self.strategy, self.slot = ctx, strategy, slot
        self.reader = ctx.open_reader()
        self.unit = strategy.make(ctx, slot)

    def where(self) -> dict[str, Any]:
        """Where Ray placed this actor: its node, its GPU ids, its process."""
        import ray

        rt = ray.get_runtime_context()
        return {"node": rt.get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def run(self, tasks: list[ShardTask]) -> list[ShardResult]:
        """Work ``tasks`` in order; the ones the journal holds already (a retried call) are not written again."""
        done = Journal(self.ctx.stage).committed(tasks)
        results = [done[t.index] for t in tasks if t.index in done]
        todo = [t for t in tasks if t.index not in done]
        if todo:
            self.unit.run(self.reader, iter(todo), lambda t: ShardWriting(t, self.ctx, None), results.append)
        return sorted(results, key=lambda r: r.index)

    def settle(self) -> None:
        """Under ``--sync end``, once every task is done: this node's share of the run on disk (the driver's
        sync at the end reaches its own machine's file system only)."""
        Journal(self.ctx.stage).settle()

    def close(self) -> None:
        for part in (self.unit, self.reader):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - closing at the end of the run
                pass


def _actors(ray: Any, strategy: Strategy, ctx: RunContext, tasks: int, asked: int | None) -> tuple[int, dict, int]:
    """(actors, their resource options, GPU actors a node shares its cores with) for the cluster as it is."""
    res = ray.cluster_resources()
    if strategy.gpu:
        gpus = int(res.get("GPU", 0))
        if gpus < 1:
            raise GpubatchError("--executor ray: the Ray cluster has no GPU for this GPU run (ray status lists its "
                                "resources); pass --device cpu to run it on the cluster's CPUs")
        per = max(1, int(ctx.gpu_procs))
        node_gpus = max(int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive"))
        # (no CPU asked: a GPU actor's reader processes use its node's cores, shared as host_procs says)
        return min(tasks, gpus * per), {"num_gpus": 1.0 / per, "num_cpus": 0}, max(1, node_gpus * per)
    cpus = int(res.get("CPU", 1))
    return min(tasks, asked or cpus), {"num_cpus": 1}, 1


def run_tasks(ctx: RunContext, strategy: Strategy, tasks: list[ShardTask], workers: int,
              on_result: Callable[[ShardResult], None], on_progress: Callable[[int], None] | None = None,
              address: str | None = None, asked: int | None = None) -> dict:
    """Run ``tasks`` on a Ray cluster (the one this process joined, else ``address``, else ``RAY_ADDRESS``,
    else one started on this machine and stopped at the end), as :func:`.local.run_tasks` does on this
    machine. ``workers`` is the local executor's count: Ray sizes the actors from the cluster's CPUs and
    GPUs instead (``asked``: ``--workers``, for CPU runs). Returns wall times (start, run)."""
    t0 = time.perf_counter()
    if not tasks:
        return {"start": 0.0, "run": 0.0}
    ray = import_ray()
    ours = not ray.is_initialized()
    if ours:
        try:
            ray.init(address=address or None, include_dashboard=False,  # (None: RAY_ADDRESS, else a new one)
                     log_to_driver=False, logging_level="ERROR")
        except ConnectionError as e:
            raise GpubatchError(f"--executor ray: cannot reach the Ray cluster at {address}: {e}") from None
    first: list[float] = []
    handles: list[Any] = []
    ready_actors = 0
    try:
        n, options, host_procs = _actors(ray, strategy, ctx, len(tasks), asked)
        remote = ray.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS, **options)(ShardActor)
        handles = [remote.remote(ctx, strategy, k, host_procs) for k in range(n)]
        chunk = max(1, len(tasks) // (4 * n)) if strategy.dealt else 1  # (a feed reads ahead across a few)
        queue = [tasks[i:i + chunk] for i in range(0, len(tasks), chunk)]
        queue.reverse()
        outputs = max(1, int(ctx.plan.outputs_per_record))
        # an actor gets work once Ray has placed and started it (one the cluster cannot place never does)
        starting = {a.where.remote(): a for a in handles}
        running: dict[Any, tuple[Any, list[ShardTask]]] = {}
        idle_since = time.perf_counter()

        def hand(actor: Any) -> None:
            if queue:
                batch = queue.pop()
                running[actor.run.remote(batch)] = (actor, batch)

        while running or (queue and starting):
            ready, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=1.0)
            if not ready:
                if not running and time.perf_counter() - idle_since > PLACE_TIMEOUT_S:
                    raise GpubatchError(f"--executor ray: the cluster placed none of {n} actors in "
                                        f"{PLACE_TIMEOUT_S:.0f} s (each needs {options}; ray status lists what "
                                        "the cluster has)")
                continue
            ref = ready[0]
            if ref in starting:
                actor = starting.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    raise GpubatchError(f"--executor ray: an actor failed to start: {e}") from None
                ready_actors += 1
                hand(actor)
                continue
            actor, batch = running.pop(ref)
            try:
                results = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, (RecordFailed, GpubatchError, OSError)):  # (OSError: the run's write error)
                    raise cause from None
                raise GpubatchError(f"a Ray task failed:\n{e}") from None
            except ray.exceptions.RayActorError as e:
                raise GpubatchError(f"a Ray actor was lost {RESTARTS + 1} times running shards "
                                    f"{batch[0].name}..: {e}") from None
            for r in results:
                if not first:
                    first.append(time.perf_counter() - t0)
                on_result(r)
            if on_progress is not None:
                on_progress(sum(t.stop - t.start for t in batch) * outputs)
            idle_since = time.perf_counter()
            hand(actor)
        if sync_mode() == "end":  # (every node's share synced before the driver makes the dataset)
            try:
                ray.get([a.settle.remote() for a in handles])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                raise GpubatchError(f"--sync end: a Ray actor failed to sync its node's shards: {e}") from None
    finally:
        try:  # (a GPU unit's reader processes and CUDA context closed, as a local worker's are)
            ray.get([a.close.remote() for a in handles], timeout=60)
        except Exception:  # noqa: BLE001 - an actor lost, or a failure already on its way
            pass
        for actor in handles:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - a lost actor
                pass
        if ours:
            ray.shutdown()
    return {"start": first[0] if first else 0.0, "run": time.perf_counter() - t0, "workers": ready_actors}
