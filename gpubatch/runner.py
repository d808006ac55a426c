"""One ``convert`` or ``augment`` run, as shards: plan -> work -> finalize.

The run reads the source's entry list, plans its shard tasks (:mod:`gpubatch.engine.execute.shards`),
opens the staging folder beside the destination (or carries on in an interrupted run's, ``--resume``),
has the tasks worked by the local executor (each committed shard journaled by the worker that wrote
it), then makes the dataset-wide files from the shards' results (the format's ``finalize``, the
parameter log, ``gpubatch.json``) and renames the whole into place. Formats are tied to the engine
here: the engine never imports them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import _prescan
from ._commit import remove_tree, sweep_partials, sync_as, sync_filesystem, sync_mode
from ._paths import check_output, shared_stage, staged_output
from ._remote import is_remote, local_url, shown
from .engine.device import Device
from .engine.execute import early as ahead_of_run
from .errors import GpubatchError, RunStats, Terminated, UsageError
from .formats import open_reader
from .formats.base import Reader, WriteOptions
from .formats.checked import CheckedSink, media_formats
from .formats.manifest import manifest_classes, write_manifest
from .types import Media, ShardResult

PARAMS_FILE = "augment-params.jsonl"
#: a run shorter than this names no bound (its start and its end are most of it)
BOUND_MIN_S = 1.0
RUN_DIR = ".gpubatch"
#: the options that do not shape the output (which workers, GPUs or caps write it; how it is reported)
FALLBACK_NOTE = "decoded on the CPU: "
UNSHAPED = frozenset({"dst", "workers", "overwrite", "resume", "gpu", "gpu_procs", "gpu_memory", "batch_size",
                      "device", "gpus", "executor", "ray_address", "num_parts", "part", "sync"})


def _sink(fmt: Any, stage: Path, info: Any, options: WriteOptions, geometric: bool, task: Any) -> CheckedSink:
    """A task's sink (module level, so that it travels to worker processes as a partial)."""
    return CheckedSink(fmt.sink(stage, task, info, options), fmt, geometric)


@dataclasses.dataclass
class Run:
    """What :func:`execute` needs of a request besides the source, the format and the plan."""

    command: str
    options: dict[str, Any]
    manifest: dict[str, Any]
    resume: bool = False
    finish: bool = False  # gpubatch finish: every shard must be committed already; only finalize runs


def fingerprint(run: Run, src_path: Path, src_format: str, entries: list, device: Device, tasks: list) -> dict:
    """What names a run for ``--resume``: the command, the options that shape its output, the source and its
    entries, the device kind (the CPU's and the GPU's JPEG encoders write different bytes), the shards."""
    from . import __version__
    from .engine.execute.journal import entries_digest

    return {"gpubatch": __version__, "command": run.command,
            "options": {k: v for k, v in run.options.items() if k not in UNSHAPED},
            "source": {"path": shown(str(src_path.resolve())), "format": src_format, "entries": len(entries),
                       "digest": entries_digest(entries)},
            "device": "gpu" if device.is_gpu else "cpu", "shards": [t.name for t in tasks][:3] + [len(tasks)]}


def execute(req: Any, run: Run, src_path: Path, dst_path: Path, fmt: Any, plan: Any, device: Device, policy: Any,
            progress: Callable[[int, int], Callable[[int], None]] | None, select: Callable[[Reader], list],
            starts_as: Callable[[Reader, Any], str | None], summary_cls: Any, ahead: Any = None) -> Any:
    """Read ``src`` -> plan shards -> work them on ``device`` -> finalize ``fmt`` at ``dst``: the summary. A
    GPU run's worker processes start before the source is listed (:func:`.engine.execute.early.started_early`),
    or before its device was probed (``ahead``: :func:`~.engine.execute.early.prestart`'s); those the run did not
    take end with it."""
    early: list[Any] = [ahead] if ahead is not None else []
    try:
        with sync_as(getattr(req, "sync", "shard")):  # (the workers take it from their sinks' options)
            return _execute(req, run, src_path, dst_path, fmt, plan, device, policy, progress, select, starts_as,
                            summary_cls, early)
    finally:
        for started in early:
            if started is not None:
                started.close()


def _execute(req: Any, run: Run, src_path: Path, dst_path: Path, fmt: Any, plan: Any, device: Device, policy: Any,
             progress: Callable[[int, int], Callable[[int], None]] | None, select: Callable[[Reader], list],
             starts_as: Callable[[Reader, Any], str | None], summary_cls: Any, early: list[Any]) -> Any:
    from .engine.execute.journal import Journal
    from .engine.execute.shards import inputs_per_shard, plan_shards
    from .engine.execute.strategies import on_host, unit_for
    from .engine.execute.worker import RunContext
    from .engine.media import DEVICE, HOST, has_codec

    t_start, t_wall = time.perf_counter(), time.time()
    stats = RunStats()
    settings = ahead_of_run.run_settings(device.is_gpu)  # (prestart's workers began with the same)
    with (_prescan.taken(src_path, req.from_format, _reader_options(req))  # (listed at the command's start)
          or open_reader(src_path, req.from_format, _reader_options(req))) as reader:
        # a COCO JSON's image folder is source too (a store's destination makes its own checks: _publish.staged)
        check_output(reader.roots(), dst_path, req.overwrite or is_remote(req.dst))
        plan = dataclasses.replace(plan, media=reader.media, layout=starts_as(reader, plan))
        if plan.touches_pixels or plan.layout:  # before reading (a pass-through has nothing to check: no codec loaded)
            plan.validate(DEVICE if device.is_gpu and has_codec(plan.media, DEVICE) else HOST)
        src_format = reader.format_name
        if plan.media == "video" and Media.VIDEO not in fmt.media and not getattr(plan.sample, "kind", "") == "frames":
            raise UsageError(f"{fmt.name} holds {' and '.join(m.value for m in fmt.media)} records, not video: "
                             f"{media_formats(Media.VIDEO)}")
        if plan.media == "audio" and Media.AUDIO not in fmt.media:  # (refused before any worker starts)
            raise UsageError(f"{fmt.name} holds {' and '.join(m.value for m in fmt.media)} records, not audio: "
                             f"{media_formats(Media.AUDIO)}")
        ahead = early[0] if early else None  # (prestart's, taken where they fit; None: started with the tasks)
        early[:] = [ahead_of_run.started_early(req, run.finish, plan, device, settings, ahead)]
        entries = select(reader)
        if not entries:
            raise GpubatchError(f"{src_path} ({src_format}) holds no records: nothing written" if req.limit != 0
                                else "--limit 0 converts no record: nothing written")
        info = reader.info()
        for message in reader.warnings:
            stats.warn(message)
        reads_without_scan = getattr(reader, "reads_without_scan", True)
    shared = getattr(req, "num_parts", None) is not None or getattr(req, "executor", "local") == "ray"
    dest = _destination(req)
    options = WriteOptions(shard_size=req.shard_size or 0, name=req.name, source=str(src_path),
                           extra={"layout": req.layout, "shared_stage": shared,  # (workers on several machines)
                                  "sync": getattr(req, "sync", "shard")})
    # (a format whose tasks are units of work only is cut finer on the host; a GPU unit's batches never
    # span two tasks, so there the shards keep their size)
    per_shard = inputs_per_shard(len(entries), req.shard_size, _outputs_per_input(plan, fmt), str(plan.media),
                                 fmt.auto_units if on_host(plan, device) else None)
    tasks = plan_shards(entries, per_shard, lambda n: fmt.shard_names(n, options))
    print_ = fingerprint(run, src_path, src_format, entries, device, tasks)
    geometric = any(op.moves_boxes for op in plan.ops)
    parts = (req.num_parts, req.part) if getattr(req, "num_parts", None) is not None else None
    mine = part_of(tasks, *parts) if parts is not None else tasks
    # (the bar counts outputs: a video's frames or clips are as many as each source gives once read, so their
    # total is not known up front, where a number of sources would show as "48/2")
    known = plan.sample is None
    total = sum(t.stop - t.start for t in mine) * plan.outputs_per_record if known else None
    tick = _ticker(progress(total)) if progress else None
    t_planned = time.perf_counter()
    timings: dict[str, float] = {"plan": round(t_planned - t_start, 4)}
    about = {"command": run.command, "request": req.options(), "device_kind": device.kind.value,
             "device_name": device.name, "parts": parts[0] if parts else None}
    if parts is not None:
        stager = shared_stage(dst_path, req.overwrite, stats.warn, claim=_claimer(print_, about, req.overwrite, stats))
    elif dest is not None:  # a store: the staging folder in gpubatch's cache, each shard uploaded as committed
        from ._publish import staged

        stager = staged(dest, req.overwrite, stats.warn, resume=_resumer(run, print_, stats, dest.shown),
                        keep=_keeper(tasks, run.finish, dest))
    else:
        stager = staged_output(dst_path, req.overwrite, stats.warn, resume=_resumer(run, print_, stats),
                               keep=_keeper(tasks, run.finish))
    try:
        with stager as stage:
            journal = Journal(stage, dest)
            done = journal.committed(tasks) if journal.exists() else {}
            if not journal.exists():
                journal.begin(print_, about)
            elif done and parts is None and not run.finish:
                stats.warn(f"--resume: {len(done)} of {len(tasks)} shards were committed by the interrupted run; "
                           f"{len(tasks) - len(done)} written now")
            ours = {t.index for t in mine}
            if tick is not None and done:
                had = sum(r.counts.get("records_in" if known else "records_out", 0) for i, r in done.items()
                          if i in ours)
                tick(had * plan.outputs_per_record if plan.copies else had)
            ctx = RunContext(opener=functools.partial(open_reader, src_path, reader.format_name, _reader_options(req)),
                             sink=functools.partial(_sink, fmt, stage, info, options, geometric), plan=plan,
                             device=device, policy=policy.value, stage=stage, settings=settings,
                             batch_size=req.batch_size, gpu_memory=req.gpu_memory, gpu_procs=1,
                             reads_without_scan=reads_without_scan, started=t_wall, store=dest)
            strategy = unit_for(ctx)
            todo = [t for t in mine if t.index not in done]
            if strategy.gpu:  # the unit's processes a GPU (one for audio and video under a cap: their plans')
                records = sum(t.stop - t.start for t in todo)
                ctx = dataclasses.replace(ctx, gpu_procs=ahead_of_run.gpu_procs(req, strategy, records,
                                                                                len(device.indexes)), on_gpu=True)
            if run.finish and todo:
                raise GpubatchError(_not_finished(todo, tasks, journal))
            workers = strategy.workers(ctx, len(todo), req.workers)
            if strategy.gpu:  # (the processes that share a GPU: fewer where there are fewer tasks)
                ctx = dataclasses.replace(ctx, gpu_procs=max(1, -(-workers // max(1, len(device.indexes)))))
            from .engine.usage import Usage

            local = getattr(req, "executor", "local") != "ray"  # (Ray's nodes are not this host's to sample)
            usage = Usage(device.indexes if strategy.gpu and local else ()).start()
            fresh: dict[int, ShardResult] = {}  # (the shards this run's workers committed, as they said)
            # (the format's finalize begun as the shards commit, where it can: a local run's own staging folder)
            ending = None if shared or dest is not None else fmt.begin_finalize(stage, info, options,
                                                                               [t.index for t in tasks])
            for r in sorted(done.values(), key=lambda r: r.index) if ending is not None else ():
                ending.committed(r)
            with _memory_watch(strategy, device, stats):
                wall = run_executor(req, ctx, strategy, todo, workers, tick, fresh, early[0] if early else None,
                                    ending.committed if ending is not None else None)
            workers = wall.get("workers", workers)
            usage = usage.stop() if todo and local else {}
            timings.update({"workers start (to the first shard committed)": round(wall["start"], 4),
                            "shards": round(wall["run"], 4)})
            if wall.get("spawned") is not None:  # (a local run's worker processes, started after the plan)
                timings["workers spawned (from the run's start)"] = round(wall["spawned"], 4)
            if wall.get("last") is not None:  # (after it, "shards" holds the workers' end)
                timings["last shard committed"] = round(wall["last"], 4)
            if wall.get("released") is not None:  # (the last worker's word that it holds nothing of the run)
                timings["workers released"] = round(wall["released"], 4)
            if parts is not None:  # this part's shards are committed: the dataset is finish's to make
                journal.settle()  # (--sync end: this machine's share on disk)
                return _part_summary(req, run, src_path, src_format, fmt, device, stats, journal, mine, todo, tasks,
                                     workers, strategy, summary_cls, usage, wall, timings, t_start, stage)
            # (a local run's own shards as its workers reported them: no second read of every entry and file;
            # Ray's workers may be other machines', so their shards are read back from the journal)
            results = journal.results(tasks, None if wall.get("remote") else {**done, **fresh})
            if dest is not None:  # (what finish uploads: the rest)
                dest.uploaded = {n for r in results for n in r.files}
            t_fin = time.perf_counter()
            summary, extra = _merge(req, run, src_path, src_format, fmt, device, stats, results, tasks, workers,
                                    strategy, summary_cls)
            _bound(summary, usage, results, todo, wall, strategy.gpu)
            sweep_partials(stage)  # (what killed writers left: every shard is committed by now)
            for message in ending.finish(results) if ending is not None else fmt.finalize(stage, results, info,
                                                                                          options):
                stats.warn(message)
            summary.warnings = list(stats.warnings)
            if plan.augmenting:
                _join_params(stage, results)
            remove_tree(stage / RUN_DIR)  # (in one step: a kill leaves the journal whole or none of it)
            timings["finalize"] = round(time.perf_counter() - t_fin, 4)
            summary.timings = {**summary.timings, **{f"wall: {k}": v for k, v in timings.items()}}
            summary.seconds = time.perf_counter() - t_start
            write_manifest(stage, {
                "format": fmt.name,
                "records": summary.records_out,
                **extra,
                "classes": manifest_classes(info.classes),
                "categories": [dict(c) for c in info.categories],
                "source": {"path": shown(str(src_path.resolve())), "format": src_format},
                **run.manifest,
                "device": str(device),
                "errors": summary.skipped,
                "warnings": summary.warnings,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            })
            if sync_mode() == "end":  # every file of the dataset on disk, in one call, before it is renamed in
                t_sync = time.perf_counter()
                sync_filesystem(stage)
                summary.timings["wall: sync"] = round(time.perf_counter() - t_sync, 4)
                summary.seconds = time.perf_counter() - t_start
    except OSError as e:  # disk full, a folder that went away...: the staging folder is gone already
        raise GpubatchError(f"writing {dst_path} failed: {e.strerror or e}"
                            f"{f' ({e.filename})' if getattr(e, 'filename', None) else ''}") from None
    return summary


def finished(dst: Path | str, summary_cls: Any, options: dict[str, Any] | None = None) -> Any:
    """``--resume`` where the run already finished (DST is there, written by gpubatch, and no interrupted
    run's staging folder is beside it; in a store: its manifest is there): its summary from its manifest,
    with a warning that says so; None otherwise. ``options``: this command's (the request's ``options()``):
    where the finished run's manifest names other ones that shape the output, UsageError names the
    first difference, as for an interrupted run (:meth:`~.engine.execute.journal.Journal.check`)."""
    from ._paths import STAGING_MARK
    from .formats.manifest import read_manifest

    store = None
    if is_remote(dst):
        from ._publish import destination

        store = destination(str(dst))
        m = store.manifest()
    else:
        dst = Path(dst)
        stage = dst.parent / f".{dst.name}{STAGING_MARK.rstrip('-')}"
        m = read_manifest(dst) if dst.is_dir() and not stage.exists() else None
    if not m or not isinstance(m.get("records"), int):
        return None
    said = _other_options(m, options) if options is not None else None
    if said:
        raise UsageError(f"--resume: {shown(str(dst))} was finished by another command ({said}); pass --overwrite "
                         "to write it again with these options")
    src = m.get("source") if isinstance(m.get("source"), dict) else {}
    errors = [e for e in m.get("errors") or [] if isinstance(e, dict)]
    left = store.tidy_finished() if store is not None else 0
    tidied = [f"--resume: removed the journal ({left:,} objects) that the run left in {dst} when it was stopped "
              "after its manifest went up"] if left else []
    return summary_cls(src=str(src.get("path", "")), dst=str(dst), src_format=str(src.get("format", "")),
                       dst_format=str(m.get("format", "")), device=str(m.get("device", "")),
                       device_reason="--resume: the run had finished", records_in=m["records"] + len(errors),
                       records_out=m["records"], skipped=errors,
                       warnings=[f"--resume: {dst} is complete already (written {m.get('created', '')}): nothing "
                                 f"to write", *tidied], shards=len((m.get("run") or {}).get("files") or ()) and
                       int((m.get("run") or {}).get("shards") or 0))


def _other_options(manifest: dict[str, Any], options: dict[str, Any]) -> str | None:
    """The first option that shapes the output (not :data:`UNSHAPED`) and differs between a finished run's
    ``manifest`` and ``options`` ("quality: None then, 80 now"), or None; the device kind where this command
    names one (the CPU's and the GPU's encoders write different bytes). The source is compared by the path
    its manifest resolved (a relative path from elsewhere names the same files); an output format not given
    now (an augment's ``to``: its destination's) is not compared, nor an option the manifest does not hold
    (one a later gpubatch added)."""
    import json

    from .engine.execute.journal import difference

    then = manifest.get("options") if isinstance(manifest.get("options"), dict) else {}
    now = json.loads(json.dumps(options, default=str))  # (as the manifest holds them: JSON's lists)
    skip = UNSHAPED | {"src"} | ({"to"} if now.get("to") is None else set())
    said = difference({k: v for k, v in then.items() if k not in skip},
                      {k: v for k, v in now.items() if k not in skip and k in then})
    if said:
        return said
    kind = str(manifest.get("device") or "").partition(":")[0]  # ("cpu", or "gpu"/"gpus" and the GPUs)
    asked = options.get("device")
    if asked in ("cpu", "gpu") and kind and ("cpu" if kind == "cpu" else "gpu") != asked:  # (their encoders' bytes differ)
        return f"device: {'cpu' if kind == 'cpu' else 'gpu'!r} then, {asked!r} now"
    if is_remote(str(options.get("src") or "")):
        return None
    was = (manifest.get("source") or {}).get("path") if isinstance(manifest.get("source"), dict) else None
    src = options.get("src")
    here = shown(str(Path(local_url(src)).resolve())) if src else None
    return f"source: {was!r} then, {here!r} now" if was and here and was != here else None


def _destination(req: Any) -> Any:
    """The store a run writes to (gpubatch._publish), or None for a local destination."""
    if not is_remote(req.dst):
        return None
    from ._publish import destination

    return destination(str(req.dst))


def _outputs_per_input(plan: Any, fmt: Any) -> float:
    return float(plan.outputs_per_record) if plan.copies else 1.0


def _resumer(run: Run, print_: dict, stats: RunStats, where: str | None = None) -> Callable[[Path], bool]:
    """Whether a run carries on in the staging folder an interrupted run left (``--resume``, the same run),
    starts over (another command: the folder is removed, and said), or is refused (the same command
    without ``--resume``: its committed shards are not thrown away unasked). ``where``: how messages name the
    place the shards are (a store's URL; by default the staging folder)."""
    from .engine.execute.journal import Journal, difference

    def decide(stage: Path) -> bool:
        journal = Journal(stage)
        if not journal.exists():
            stats.warn(f"removed {stage.name}, an unfinished output folder of a killed run")
            return False
        if run.resume:
            journal.check(print_)
            return True
        try:
            said = difference(journal.fingerprint(), print_)
        except GpubatchError:
            said = "a damaged journal"
        if said is None:
            raise UsageError(f"an interrupted run of this command left its committed shards in {where or stage}: pass "
                             "--resume to finish it, or --overwrite to start over")
        stats.warn(f"removed {where or stage.name}, the unfinished output of another command ({said})")
        return False

    return decide


def _keeper(tasks: list, finishing: bool = False, store: Any = None) -> Callable[[Path, BaseException], str | None]:
    """Why an interrupted run's staging folder stays (shards are committed: ``--resume`` finishes it), or
    None (it goes). ``gpubatch finish`` never removes it: it holds the parts' shards. ``store``: where the
    committed shards went (gpubatch._publish), if not the staging folder."""
    from .engine.execute.journal import Journal

    def keep(stage: Path, error: BaseException) -> str | None:
        if finishing:
            return f"the committed shards stay in {stage}"
        if not isinstance(error, (KeyboardInterrupt, Terminated)):
            return None
        n = len(Journal(stage, store).committed(tasks))
        if not n:
            return None
        return (f"{n} of {len(tasks)} shards are committed in {store.shown if store is not None else stage}: run the "
                "same command with --resume to write the rest")

    return keep


def part_of(tasks: list, parts: int, part: int) -> list:
    """The tasks of part ``part`` of ``parts``: consecutive shards, the parts as even as the count allows."""
    n = len(tasks)
    return tasks[part * n // parts:(part + 1) * n // parts]


def _claimer(print_: dict, about: dict, overwrite: bool, stats: RunStats) -> Callable[[Path], None]:
    """What a part checks of the shared staging folder (under the output's lock): it is this run's, cut into
    as many parts, or new (its journal is begun here); another command's is refused (removed with
    ``--overwrite``)."""
    from .engine.execute.journal import Journal, difference

    def claim(stage: Path) -> None:
        journal = Journal(stage)
        if not journal.exists():
            if any(stage.iterdir()):  # a killed run's folder without a journal: nothing in it can be kept
                shutil.rmtree(stage)
                stage.mkdir()
                stats.warn(f"removed {stage.name}, an unfinished output folder of a killed run")
            journal.begin(print_, about)
            return
        said = difference(journal.fingerprint(), print_)
        if said is None:
            had = journal.run().get("parts")
            if had != about["parts"]:
                raise UsageError(f"--num-parts {about['parts']}: the run in {stage} was cut into "
                                 f"{had or 'no'} parts; run every part with --num-parts {had}" if had else
                                 f"--num-parts {about['parts']}: {stage} holds a run without parts: finish it with "
                                 "--resume, or pass --overwrite")
            return
        if not overwrite:
            raise UsageError(f"{stage} holds another command's shards ({said}): finish that run, or pass --overwrite "
                             "to start this one over")
        shutil.rmtree(stage)
        stage.mkdir()
        journal.begin(print_, about)
        stats.warn(f"removed {stage.name}, the unfinished output of another command ({said})")

    return claim


def _not_finished(todo: list, tasks: list, journal: Any) -> str:
    """``gpubatch finish`` refused: the shards not committed, by part where the run had parts."""
    names = ", ".join(t.name for t in todo[:3]) + (", ..." if len(todo) > 3 else "")
    parts = journal.run().get("parts")
    if parts:
        missing = sorted({p for p in range(parts) for t in part_of(tasks, parts, p) if t in todo})
        which = ", ".join(str(p) for p in missing)
        return (f"{len(todo)} of {len(tasks)} shards are not committed: part{'s' if len(missing) > 1 else ''} {which} "
                f"of {parts} ({names}); run {'them' if len(missing) > 1 else 'it'} (--num-parts {parts} --part I), "
                "then finish again")
    return (f"{len(todo)} of {len(tasks)} shards are not committed ({names}): run the command again with --resume "
            "to write them")


def _part_summary(req: Any, run: Run, src_path: Path, src_format: str, fmt: Any, device: Device, stats: RunStats,
                  journal: Any, mine: list, todo: list, tasks: list, workers: int, strategy: Any, summary_cls: Any,
                  usage: dict, wall: dict, timings: dict, t_start: float, stage: Path) -> Any:
    """The summary of one part's run (its shards; no dataset-wide file: ``gpubatch finish`` writes them)."""
    done = journal.committed(tasks)
    results = [done[t.index] for t in mine if t.index in done]
    summary, _ = _merge(req, run, src_path, src_format, fmt, device, stats, results, mine, workers, strategy,
                        summary_cls, allow_empty=True)
    _bound(summary, usage, results, todo, wall, strategy.gpu)
    left = [t for t in tasks if t.index not in done]
    shards = f"{len(mine)} shard{'' if len(mine) == 1 else 's'}"
    stats.warn(f"part {req.part} of {req.num_parts}: {shards} committed in {stage}; "
               + (f"{len(left)} of {len(tasks)} shards (other parts') are still to be written; run 'gpubatch finish "
                  f"{req.dst}' once all parts are done" if left else
                  f"every part's shards are committed: run 'gpubatch finish {req.dst}'"))
    summary.warnings = list(stats.warnings)
    summary.timings = {**summary.timings, **{f"wall: {k}": v for k, v in timings.items()}}
    summary.seconds = time.perf_counter() - t_start
    return summary


def _merge(req: Any, run: Run, src_path: Path, src_format: str, fmt: Any, device: Device, stats: RunStats,
           results: list[ShardResult], tasks: list, workers: int, strategy: Any, summary_cls: Any,
           allow_empty: bool = False) -> tuple[Any, dict]:
    """The run's summary from its shards' results (in shard order), and what the manifest says besides."""
    from .engine.execute.worker import COUNTS

    totals = dict.fromkeys(COUNTS, 0)
    skipped: list[dict] = []
    sums: dict[str, float] = {}
    audio: list[dict] = []
    gpu_memory: dict[str, Any] = {}
    for r in results:
        for k in COUNTS:
            totals[k] += int(r.counts.get(k, 0))
        skipped += r.skipped
        for w in r.warnings:
            if w.startswith(FALLBACK_NOTE):  # the first few by name over all shards (the summary counts them)
                named = sum(1 for x in stats.warnings if x.startswith(FALLBACK_NOTE))
                if named >= 10:
                    continue
            stats.warn(w)
        for k, v in r.timings.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        for facts in r.extra.get("audio", []):
            if facts not in audio:
                audio.append(facts)
        if r.extra.get("gpu_memory"):  # the cap and its plan (each worker's, alike)
            gpu_memory = {**gpu_memory, **r.extra["gpu_memory"]}
    if stats.gpu_memory.get("peak_mib") is not None:  # this run's workers as the driver counted them
        gpu_memory = {**gpu_memory, **stats.gpu_memory}
    if totals["records_in"] and not totals["records_out"] and not allow_empty:
        reasons: dict[str, int] = {}
        for e in skipped:
            key = f"{e['stage']}: {e['reason']}"
            reasons[key] = reasons.get(key, 0) + 1
        reason, n = max(reasons.items(), key=lambda kv: kv[1]) if reasons else ("no output", totals["records_in"])
        raise GpubatchError(f"none of the {totals['records_in']} records of {src_path} could be converted "
                            f"({n} x {reason}): nothing written")
    if len(audio) > 1 and not fmt.carries_record_meta:
        rates = ", ".join(str(a.get("sample_rate")) for a in audio)
        raise GpubatchError(f"{fmt.name} holds no sample rate a record, and the arrays written are at several "
                            f"({rates} Hz): pass --sample-rate, or write to webdataset or tfrecord")
    extra: dict[str, Any] = {"shards": {r.name: r.counts.get("records_out", 0) for r in results}} if fmt.sharded else {}
    if len(audio) == 1:
        extra["audio"] = audio[0]
    extra["run"] = {"shards": len(tasks), "workers": workers, "unit": strategy.name,
                    "files": {n: m for r in results for n, m in r.files.items() if not n.startswith(RUN_DIR)}}
    summary = summary_cls(
        src=str(src_path), dst=str(req.dst), src_format=src_format, dst_format=fmt.name, device=str(device),
        device_reason=device.reason, records_in=totals["records_in"], records_out=totals["records_out"],
        passthrough=totals["passthrough"], transcoded=totals["transcoded"], fallbacks=totals["fallbacks"],
        boxes_dropped=totals["boxes_dropped"], first_frames=totals["first_frames"], bytes_in=totals["bytes_in"],
        bytes_out=totals["bytes_out"], skipped=skipped, timings={k: round(v, 4) for k, v in sums.items()},
        gpu_memory=gpu_memory, shards=len(tasks), workers=workers)
    summary.timings.update(worker_walls(results))
    return summary, extra


def worker_walls(results: list[ShardResult]) -> dict[str, float]:
    """When the GPU image and audio workers' steps came (their shards' ``marks``, seconds from the run's start), the
    earliest of each over the workers, in the order they came: ``wall: first batch (from the run's start)`` and
    ``wall (worker): NAME``."""
    marks: dict[str, float] = {}
    for r in results:
        for name, v in (r.extra.get("marks") or {}).items():
            marks[name] = min(marks.get(name, float(v)), float(v))
    out = {}
    if "first batch" in marks:  # (the first batch on its way)
        out["wall: first batch (from the run's start)"] = round(marks.pop("first batch"), 4)
    out.update({f"wall (worker): {name}": round(v, 4) for name, v in sorted(marks.items(), key=lambda kv: kv[1])})
    return out


@contextlib.contextmanager
def _memory_watch(strategy: Any, device: Device, stats: RunStats) -> Iterator[None]:
    """The device memory of a GPU run's worker processes (this process and every one it starts), sampled
    while they run; its peak goes into ``stats.gpu_memory``."""
    if not strategy.gpu:
        yield
        return
    from .engine.gpu.memory import watch

    with watch(device.indexes, stats):
        yield


def _ticker(advance: Callable[..., None]) -> Callable[..., None]:
    """The run's progress callback: ``tick(n)``, or ``tick(n, gpu)`` from a worker of a several-GPU run, passed
    on where ``advance`` takes the GPU (gpubatch's bar, which shows a row a GPU); a caller's ``advance(n)``
    gets the count alone."""
    if getattr(advance, "takes_where", False):
        return advance
    return lambda n, where=None: advance(n)


def run_executor(req: Any, ctx: Any, strategy: Any, tasks: list, workers: int,
                 tick: Callable[[int], None] | None, results: dict[int, ShardResult] | None = None,
                 started: Any = None, committed: Callable[[ShardResult], None] | None = None) -> dict:
    """The run's tasks through the executor the request names (``--executor local|ray``); each committed
    shard's result into ``results`` by its index, and to ``committed`` (the local executor's workers ``started``
    already, where some were). The wall times have ``remote`` where the executor's workers may run on other
    machines."""
    def keep(r: ShardResult) -> None:
        if results is not None:
            results[r.index] = r
        if committed is not None:
            committed(r)

    if getattr(req, "executor", "local") == "ray":
        from .engine.execute.ray import run_tasks
        wall = run_tasks(ctx, strategy, tasks, workers, keep, tick, address=getattr(req, "ray_address", None),
                         asked=req.workers)
        return {**wall, "remote": True}
    from .engine.execute.local import run_tasks
    return run_tasks(ctx, strategy, tasks, workers, keep, tick, started)


def _bound(summary: Any, usage: dict, results: list[ShardResult], todo: list, wall: dict, gpu: bool) -> None:
    """The summary's per-GPU records and rates (the shards this run wrote, by the GPU that wrote them) and
    the resource that bound the run (:func:`~gpubatch.engine.usage.bound`)."""
    from .engine.usage import bound

    seconds = wall["run"]
    ran = {t.index for t in todo}
    mine = [r for r in results if r.index in ran]
    per_gpu: dict[str, dict[str, Any]] = {}
    for r in mine:
        if "gpu" in r.extra:
            g = per_gpu.setdefault(str(r.extra["gpu"]), {"shards": 0, "records": 0})
            g["shards"] += 1
            g["records"] += int(r.counts.get("records_in", 0))
    for g in per_gpu.values():
        g["records_per_s"] = round(g["records"] / seconds, 1) if seconds > 0 else 0.0
    summary.per_gpu = per_gpu
    if not mine:
        return
    written = sum(float(r.timings.get("write", 0.0)) for r in mine)
    busy = sum(float(r.timings.get("shard", 0.0)) for r in mine)
    summary.usage = usage
    share = written / busy if busy > 0 and not gpu else None  # (a GPU unit's writes wait on the GPU)
    if usage and seconds >= BOUND_MIN_S:  # (a Ray run: its nodes are not this host's to sample)
        several = len(mine) > max(1, summary.workers)  # (where the first shards are the last, no start to tell)
        summary.bound = bound(usage, share, wall.get("start") if several else None, seconds)


def _join_params(stage: Path, results: list[ShardResult]) -> None:
    """An augment run's ``augment-params.jsonl``: the shards' parameter logs, in shard order."""
    folder = stage / RUN_DIR / "params"
    with open(stage / PARAMS_FILE, "wb") as out:
        for r in results:
            part = folder / f"{r.index:06d}.jsonl"
            if part.exists():
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)


def _reader_options(req: Any) -> dict[str, Any]:
    """What the request says about reading its source (an audio CSV's columns)."""
    return {k: getattr(req, k, None) for k in ("path_column", "label_column") if getattr(req, k, None)}
