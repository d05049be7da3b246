"""wasmjobs guest SDK for Python: write a job as one decorated function.

    # app.py, built with componentize-py (see guest-sdk/python/README.md)
    from wasmjobs_guest import WitWorld, job, log, http, Retry  # noqa: F401 (WitWorld is the export)

    @job
    def perform(info, url):
        response = http.get(url)
        log.info(f"GET {url}: {response.status}")
        if not response.ok:
            raise Retry(f"HTTP {response.status}")

* **Arguments**: the job's JSON args array is decoded and spread into the
  function after ``info`` (a :class:`JobInfo`). Args that do not fit the
  signature fail the job as *dead*: retrying the same args cannot help.
  Annotated parameters are checked too (``int``, ``float``, ``str``,
  ``bool``, ``list[...]``, ``dict[str, ...]``, ``X | None``, ``Any``):
  ``def perform(info, name: str)`` sends ``[42]`` to the dead set, where
  an unannotated ``name`` would let the job fail later, as a retry.
* **Outcome**: returning succeeds; raising :class:`Retry`, :class:`Discard`
  or :class:`Dead` says what the host should do; any other exception is a
  *retry* whose message is ``ExceptionType: message`` (the traceback is
  logged at error level).
* **Several jobs at once**: a plugin built for the ``async-plugin`` world
  (``[instances] concurrent = K`` in its manifest; ``wasmjobs build`` picks
  the world from it) declares its job ``async def`` and awaits
  :mod:`http` and :mod:`sql` calls (``response = await http.get(url)``);
  while one job waits, up to K-1 others run in the same instance. They
  share the module's globals; :class:`JobInfo` is each job's own, and
  :mod:`log` lines carry each job's own ``jid``.
* **Capabilities**: :mod:`log`, :mod:`http` and :mod:`sql` call the host
  through the ``wasmjobs:job`` WIT imports; files are plain ``open()`` on
  the directories the plugin's manifest preopens.

The module runs when the component is *built* (componentize-py snapshots
the interpreter), so import everything at the top of ``app.py``, and call no
capability at import time: the host is not there yet.
"""

import inspect
import json
import traceback
import types
import typing
from dataclasses import dataclass

import wit_world
from componentize_py_types import Err
from wit_world.imports import wasmjobs_job_types as _types

from . import _dev, activejob, http, log, sql

__all__ = ["WitWorld", "job", "JobInfo", "Retry", "Discard", "Dead", "http", "log", "sql"]

# How much of the args text an "invalid args" message quotes.
_ARGS_IN_MESSAGE = 200


@dataclass(frozen=True)
class JobInfo:
    """The job being run, as fetched from the queue."""

    jid: str
    class_name: str
    queue: str
    args: str
    retry_count: int
    enqueued_at_ms: int


class JobFailure(Exception):
    """Base of the exceptions that choose a job's outcome."""


class Retry(JobFailure):
    """A transient failure: retry the job following its retry policy."""


class Discard(JobFailure):
    """The job cannot succeed and nobody needs to see it: drop it."""


class Dead(JobFailure):
    """The job cannot succeed: move it to the dead set for a person to look at."""


_perform = None
# The job's parameters after ``info`` with their annotations, read once
# when the job is registered (at build time, in the snapshot).
_params = []
# The job's signature, read once (reading it costs more than binding it).
_signature = None


def _forget_job():
    """Forgets the registered job: a development build's app whose import
    failed after its ``@job`` ran registers it again on the next try."""
    global _perform, _params, _signature
    _perform, _params, _signature = None, [], None


def job(function):
    """Registers ``function(info, *args)`` as the plugin's job (one per plugin)."""
    global _perform, _params, _signature
    if _perform is not None:
        raise RuntimeError(f"a job is already registered ({_perform.__name__}); a plugin has one")
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - unresolvable annotations are not checked
        hints = {}
    _signature = inspect.signature(function)
    _params = [(p.name, p.kind, hints.get(p.name)) for p in list(_signature.parameters.values())[1:]]
    _perform = function
    return function


_JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}


def _json_type(value):
    if value is None:
        return "null"
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return _JSON_NAMES[kind]
    return type(value).__name__


def _fits(value, expected):
    """Whether a decoded JSON value fits an annotation (unknown ones fit)."""
    if expected is typing.Any or expected is object:
        return True
    if expected is None or expected is type(None):
        return value is None
    origin = typing.get_origin(expected)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, member) for member in typing.get_args(expected))
    members = typing.get_args(expected)
    if origin is list:
        return isinstance(value, list) and (not members or all(_fits(item, members[0]) for item in value))
    if origin is dict:
        return isinstance(value, dict) and (not members or all(_fits(item, members[1]) for item in value.values()))
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected in (str, list, dict):
        return isinstance(value, expected)
    return True


def _describe(expected):
    return getattr(expected, "__name__", None) if typing.get_origin(expected) is None else str(expected).replace("typing.", "")


def _check_types(bound):
    for name, kind, expected in _params:
        if expected is None or name not in bound.arguments:
            continue
        values = bound.arguments[name]
        values = values if kind is inspect.Parameter.VAR_POSITIONAL else (values,)
        for value in values:
            if not _fits(value, expected):
                return f"{name} must be {_describe(expected) or expected}, got {_json_type(value)} {json.dumps(value)[:40]}"
    return None


def _run(wit_job):
    info = JobInfo(
        jid=wit_job.jid,
        class_name=wit_job.class_,
        queue=wit_job.queue,
        args=wit_job.args,
        retry_count=wit_job.retry_count,
        enqueued_at_ms=wit_job.enqueued_at_ms,
    )
    if _perform is None:
        raise Dead("the plugin registered no job: decorate its function with @wasmjobs_guest.job")
    quoted = info.args[:_ARGS_IN_MESSAGE]
    try:
        args = json.loads(info.args)
    except ValueError as error:
        raise Dead(f"invalid args for {info.class_name} {quoted}: not JSON: {error}") from None
    if not isinstance(args, list):
        raise Dead(f"invalid args for {info.class_name} {quoted}: expected a JSON array")
    try:
        bound = _signature.bind(info, *args)
    except TypeError as error:
        raise Dead(f"invalid args for {info.class_name} {quoted}: {error}") from None
    mismatch = _check_types(bound)
    if mismatch is not None:
        raise Dead(f"invalid args for {info.class_name} {quoted}: {mismatch}")
    return _perform(info, *args)


def _outcome(error):
    """The ``Err`` a raised exception becomes: its own case for
    :class:`Retry`, :class:`Discard` and :class:`Dead`, a logged retry for
    anything else."""
    for kind, case in ((Retry, _types.JobError_Retry), (Discard, _types.JobError_Discard), (Dead, _types.JobError_Dead)):
        if isinstance(error, kind):
            return Err(case(str(error)))
    log.error("".join(traceback.format_exception(error)).rstrip())
    return Err(_types.JobError_Retry(f"{type(error).__name__}: {error}"))


# Whether the component was built for the async-plugin world, whose
# `perform` is an `async func` the host may call several times at once.
_ASYNC_WORLD = inspect.iscoroutinefunction(wit_world.WitWorld.perform)

if _ASYNC_WORLD:

    class WitWorld(wit_world.WitWorld):
        """The component's export: import it into ``app.py`` (componentize-py
        looks for a class of this name in the app module)."""

        async def perform(self, wit_job):
            try:
                _dev.load(_forget_job)
                running = _run(wit_job)
                if inspect.isawaitable(running):
                    await running
            except Exception as error:  # noqa: BLE001 - every exception is an outcome
                raise _outcome(error) from None

else:

    class WitWorld(wit_world.WitWorld):
        """The component's export: import it into ``app.py`` (componentize-py
        looks for a class of this name in the app module)."""

        def perform(self, wit_job):
            try:
                _dev.load(_forget_job)
                if inspect.iscoroutinefunction(_perform):
                    raise Dead(
                        f"{_perform.__name__} is an async def, which needs the async-plugin world: "
                        "set [instances] concurrent in wasmjobs.toml and build again"
                    )
                _run(wit_job)
            except Exception as error:  # noqa: BLE001 - every exception is an outcome
                raise _outcome(error) from None
