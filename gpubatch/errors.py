"""Errors, the per-record error policy, run statistics and exit codes.

A user mistake (missing source, bad option, output in the way) raises a :class:`GpubatchError` whose
message is one line that says what is wrong and how to fix it; the CLI prints it without a traceback.
A problem with one record (corrupt JPEG, bad protobuf) is a :class:`RecordError` value handled by one
:class:`ErrorPolicy`: skipped and reported, or fatal.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: what helps a run that ran out of memory or of threads (the command's and its workers' one-line errors)
LIMITS = ("a limit on this process's memory or threads (ulimit -v / -u, a container's memory): give it more, or "
          "pass fewer --workers")


class ExitCode(enum.IntEnum):
    """Process exit codes of the ``gpubatch`` command."""

    OK = 0
    ERROR = 1  # the run failed (I/O error, GPU error, ...)
    USAGE = 2  # bad command line or options (click uses 2 too)
    BAD_RECORD = 3  # --on-error fail stopped on a bad record
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    TERMINATED = 143  # SIGTERM (kill, a job scheduler's timeout)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run winds down as on Ctrl-C: staging removed."""


class GpubatchError(Exception):
    """An error a user can act on; ``str(err)`` is a one-line message."""

    exit_code = ExitCode.ERROR


class UsageError(GpubatchError):
    """Bad arguments: unknown format, missing source, output in the way, ..."""

    exit_code = ExitCode.USAGE


class FormatError(GpubatchError):
    """A dataset that cannot be read as the format it claims to be."""


class DependencyError(GpubatchError):
    """An optional dependency is missing; the message names the ``pip install`` that fixes it."""


class Stage(str, enum.Enum):
    """Where in the pipeline a record failed."""

    READ = "read"
    DECODE = "decode"
    TRANSFORM = "transform"
    ENCODE = "encode"
    WRITE = "write"


class RecordError(Exception):
    """One record could not be processed.

    Attributes:
        key: the record's key.
        origin: where it came from ("shard.tar#member").
        stage: the pipeline stage that failed.
        reason: one line saying why.
    """

    def __init__(self, key: str, origin: str, stage: Stage | str, reason: str):
        self.key = key
        self.origin = origin
        self.stage = Stage(stage)
        self.reason = " ".join(str(reason).split()) or "unknown error"
        super().__init__(f"{origin or key}: {self.stage.value}: {self.reason}")

    def as_dict(self) -> dict:
        return {"key": self.key, "origin": self.origin, "stage": self.stage.value, "reason": self.reason}

    def __reduce__(self):  # travels between worker processes
        return (RecordError, (self.key, self.origin, self.stage.value, self.reason))


class RecordCondition(ValueError):
    """A record's own condition that its op found, said in words (an image an op would make too large, a recording too
    short for a feature frame): its reason is the message alone, with no exception's name before it."""


def reason_of(e: BaseException) -> str:
    """A record's reason for exception ``e``: its words alone where it is a :class:`RecordCondition`, else its type's
    name first (an op's or a library's failure, which the name helps to place)."""
    return str(e) if isinstance(e, RecordCondition) else f"{type(e).__name__}: {e}"


class RecordFailed(GpubatchError):
    """Raised under ``--on-error fail`` when a record fails."""

    exit_code = ExitCode.BAD_RECORD

    def __init__(self, error: RecordError):
        self.error = error
        super().__init__(f"stopped at a bad record (use --on-error skip to skip it): {error}")

    def __reduce__(self):  # travels from a worker process to the run's
        return (RecordFailed, (self.error,))


class ErrorPolicy(str, enum.Enum):
    """What a run does with a bad record."""

    SKIP = "skip"
    FAIL = "fail"


@dataclass
class RunStats:
    """Counters of one run, shared by the pipeline threads; feeds the summary and the manifest."""

    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    passthrough: int = 0
    transcoded: int = 0
    fallbacks: int = 0
    boxes_dropped: int = 0
    first_frames: int = 0  # images of several frames (animated, multi-page) re-encoded from their first
    errors: list[RecordError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # output key -> the parameters drawn for it (augment runs), taken by the writer as it writes the record
    drawn: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per pipeline stage (summed over threads)
    # a GPU run's device memory: peak_mib (every process of the run, from NVML, outside a context's first
    # moment), context_start_mib (that moment, where higher), cap_mib, processes, method, plan
    gpu_memory: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def timed(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def warn(self, message: str) -> None:
        with self._lock:
            if message not in self.warnings:
                self.warnings.append(message)

    def error_reasons(self) -> Counter:
        return Counter(f"{e.stage.value}: {e.reason}" for e in self.errors)


class ErrorRouter:
    """Applies an :class:`ErrorPolicy` to record errors and records them in :class:`RunStats`."""

    def __init__(self, policy: ErrorPolicy | str, stats: RunStats):
        self.policy = ErrorPolicy(policy)
        self.stats = stats

    def __call__(self, error: RecordError) -> None:
        with self.stats._lock:
            self.stats.errors.append(error)
        if self.policy is ErrorPolicy.FAIL:
            raise RecordFailed(error)


# --- suggestions for mistyped names --------------------------------------------------------------------


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def did_you_mean(value: str, choices: list[str] | tuple[str, ...], aliases: dict[str, str] | None = None) -> str:
    """`` (did you mean 'webdataset'?)`` for a mistyped ``value``, or "" where nothing is close: an alias
    (``wds``), the same name without case, ``_`` and ``-`` (``randomresizedcrop``), a choice it starts
    (``resnet50``: ``resnet50-train`` or ``resnet50-val``), or a near spelling (``webdatset``)."""
    import difflib

    value = str(value)
    squashed = _squash(value)
    found = [aliases[squashed]] if aliases and squashed in aliases else []
    found = found or [c for c in choices if _squash(c) == squashed]
    found = found or [c for c in choices if squashed and _squash(c).startswith(squashed)]
    found = found or difflib.get_close_matches(value.lower(), list(choices), n=2, cutoff=0.7)
    if not found:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in found[:2]) + "?)"


# --- messages in the words of the caller ----------------------------------------------------------------
#
# Messages name the command's flags (``pass --overwrite to replace it``); a Python caller sees the keyword
# arguments instead (``pass overwrite=True``). The command marks its calls (FROM_CLI); the public API
# functions are wrapped with :func:`python_messages`.

FROM_CLI: contextvars.ContextVar[bool] = contextvars.ContextVar("gpubatch_from_cli", default=False)
_SWITCHES = {"overwrite", "shuffle", "keep-original", "json", "with-model"}
_KEYWORDS = {"from": "from_format"}
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?:(\s+)(png|jpeg|keep|fail|skip|full|headers|[0-9][0-9,]*(?:\.[0-9]+)?)\b)?")


def python_words(message: str) -> str:
    """``message`` with the command's flags given as the API's keyword arguments: ``--overwrite`` as
    ``overwrite=True``, ``--image-format png`` as ``image_format="png"``, ``--limit`` as ``limit``."""

    def keyword(m: re.Match) -> str:
        flag, value = m.group(1), m.group(3)
        name = _KEYWORDS.get(flag, flag.replace("-", "_"))
        if flag in _SWITCHES:
            return f"{name}=True"
        if value is None:
            return name
        return f"{name}={value.replace(',', '')}" if value[0].isdigit() else f'{name}="{value}"'

    return _FLAG.sub(keyword, message)


#: what a message goes through before a caller sees it (a remote source's mirror gives its paths as URLs)
MESSAGE_HOOKS: list = []


def python_messages(fn):
    """Decorate a public API function: a GpubatchError it raises to a Python caller speaks of keyword
    arguments, not of the command's flags."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GpubatchError as e:
            if e.args and isinstance(e.args[0], str):
                for hook in MESSAGE_HOOKS:
                    e.args = (hook(e.args[0]), *e.args[1:])
            if not FROM_CLI.get() and e.args and isinstance(e.args[0], str):
                e.args = (python_words(e.args[0]), *e.args[1:])
            raise

    return call


#: the record a thread is reading, decoding or writing (its key), for the warnings a library raises there
#: (:mod:`gpubatch.report.noise` names the record with them)
CURRENT = threading.local()


def current_record() -> str | None:
    return getattr(CURRENT, "key", None)


def register_once(table: dict, key: Any, value: Any, what: str, name: Any = None) -> Any:
    """Put ``value`` in a registry ``table`` under ``key``, refusing a second, different one under a name
    already taken (a plugin's op named like a built-in one would otherwise replace it without a word).
    The same definition again (a module imported twice) is no duplicate. ``name``: the key as the message
    names it."""
    old = table.get(key)
    if old is not None and old is not value and _identity(old) != _identity(value):
        raise ValueError(f"{what} {key if name is None else name!r} is registered already ({_identity(old)}); not replaced by {_identity(value)}")
    table[key] = value
    return value


def _identity(value: Any) -> str:
    """Where a registered thing is defined: module.qualname of a class or function (of an instance's class)."""
    target = value if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__") else type(value)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
