"""Log lines that land in the host's `tracing` output, tagged with the job's
``jid`` and ``class`` (the ``wasmjobs:job/log`` import). ``print`` works too:
stdout and stderr are captured into the same log."""

from wit_world.imports import log as _log


def trace(message):
    """Logs ``message`` at trace level."""
    _log.log(_log.Level.TRACE, str(message))


def debug(message):
    """Logs ``message`` at debug level."""
    _log.log(_log.Level.DEBUG, str(message))


def info(message):
    """Logs ``message`` at info level."""
    _log.log(_log.Level.INFO, str(message))


def warn(message):
    """Logs ``message`` at warn level."""
    _log.log(_log.Level.WARN, str(message))


def error(message):
    """Logs ``message`` at error level."""
    _log.log(_log.Level.ERROR, str(message))
