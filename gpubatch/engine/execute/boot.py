"""A worker process's first step, light on purpose: the GPU's start begun (:func:`..gpu.start.boot`), then
the run's parts unpickled and the worker's loop (:func:`.local._worker`) run.

The run's context and strategy come as bytes, pickled by the parent, so that the process's own start
(``spawn`` unpickles a process's arguments before it calls its target) imports only this module: the CUDA
context and the hardware decoder's instances are then made in a thread while this one imports the rest of
gpubatch (about 0.25 s on a 2-core host) and unpickles the run.
"""

from __future__ import annotations

from typing import Any


def boot(early: Any, payload: Any, slot: int, tasks: Any, results: Any) -> None:
    """Begin ``early`` (a :class:`..gpu.start.Early`, or None), then run worker ``slot`` over the run that
    ``payload`` holds (``pickle`` of its context and strategy), or that comes on ``payload`` where it is a
    queue (a process started before its run was planned: :class:`.local.Started`; None there: no run for
    it, it ends); a failure to unpickle it reported to ``results`` as a crash, as the worker's own failures
    are."""
    from ..processes import die_with_parent

    die_with_parent()
    if early is not None:
        from ..gpu.start import boot as begin

        begin(early)
    import pickle

    if not isinstance(payload, bytes):
        payload = payload.get()
        if payload is None:
            return
    try:
        ctx, strategy = pickle.loads(payload)
    except BaseException:  # noqa: BLE001 - the coordinator reports it; nothing else would see it
        import traceback

        results.put(("failed", "crash", traceback.format_exc()))
        return
    from .local import _worker

    _worker(ctx, strategy, slot, tasks, results)
