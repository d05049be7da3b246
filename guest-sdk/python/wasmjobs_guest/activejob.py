"""Jobs a Rails app enqueued through ActiveJob (the ``wasmjobs:job/activejob``
import).

``WelcomeJob.perform_later(user, tag: :vip)`` in a Rails app runs on the
plugin that lists ``WelcomeJob``; the host decodes its ActiveJob arguments
into plain JSON, so the job function gets ``"gid://app/User/42"`` and
``{"tag": "vip"}`` (keyword arguments are the last argument, a dict). The
rest of the ActiveJob hash::

    from wasmjobs_guest import activejob, job, log

    @job
    def perform(info, user, options):
        aj = activejob.context()
        if aj is not None:
            log.info(f"{user}: ActiveJob {aj.job_id}, locale {aj.locale}")
        raw = activejob.raw()  # the hash exactly as Ruby wrote it (JSON text)
"""

from dataclasses import dataclass
from typing import Optional

from wit_world.imports import activejob as _activejob


@dataclass(frozen=True)
class Context:
    """ActiveJob's fields of the job being run."""

    job_id: str
    """ActiveJob's id (a UUID), not the Sidekiq jid."""
    job_class: str
    """``job_class``: the class as Rails named it."""
    executions: int
    """Runs before this one that Ruby's ``retry_on`` counted (the host's own
    retries are ``info.retry_count``)."""
    priority: Optional[int]
    locale: Optional[str]
    timezone: Optional[str]
    enqueued_at: Optional[str]
    """ISO 8601."""
    scheduled_at: Optional[str]
    """ISO 8601, for a job enqueued with ``wait`` or ``wait_until``."""


def context():
    """The ActiveJob context of the job being run, or ``None`` for a job not
    enqueued through ActiveJob."""
    c = _activejob.current()
    if c is None:
        return None
    return Context(
        job_id=c.job_id,
        job_class=c.job_class,
        executions=c.executions,
        priority=c.priority,
        locale=c.locale,
        timezone=c.timezone,
        enqueued_at=c.enqueued_at,
        scheduled_at=c.scheduled_at,
    )


def raw():
    """The ActiveJob hash exactly as Ruby wrote it (``arguments`` undecoded),
    as JSON text, or ``None`` for a job not enqueued through ActiveJob."""
    return _activejob.raw()
