"""Development builds (``wasmjobs build --dev``): the app is imported when
an instance runs its first job, not when the component is built.

A development build is a *loader* component: its snapshot holds this SDK
and every module the app's sources import at module level (found when it
was built, :func:`preimport`), but not the app. The host unpacks the app's
``.py`` files, which the component carries, read-only at ``/.wasmjobs/app``;
:func:`load`, called by the job's ``perform`` before anything else on an
instance's first job, puts that directory first on ``sys.path`` and imports
the app, whose ``@job`` then registers as in a release build. So an edit to the app
needs no new snapshot and no native compile.

What differs from a release build: the app's module-level code runs in each
instance, once, with the host there (a release build runs it once, at build
time); and a module the sources did not import at module level is missing in
both, as componentize-py's snapshot holds only what was imported.
"""

import importlib
import os
import sys

# (directory, module) to import on the first job; None once imported, or in
# a release build.
_pending = None
# The modules the build found imported whose import failed in the snapshot.
_missing = set()


def preimport(names):
    """Imports ``names`` into the snapshot; one that fails is skipped (it
    fails the same way in a release build, when the app imports it)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional import, as in the app
            _missing.add(name)


def arm(directory, module):
    """Makes the first job import ``module`` from ``directory``."""
    global _pending
    _pending = (directory, module)


def load(forget_job):
    """Imports the app if this is a development build that has not yet. An
    import that fails raises, after ``forget_job()`` undoes a registration
    it made, and the next job tries again."""
    global _pending
    if _pending is None:
        return
    directory, module = _pending
    sys.dont_write_bytecode = True
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        forget_job()
        if error.name in _missing:
            raise ModuleNotFoundError(
                f"{error} (neither the standard library nor the plugin directory has it; "
                "a release build would fail the same way)",
                name=error.name,
            ) from None
        if error.name and not _local(directory, error.name):
            raise ModuleNotFoundError(
                f"{error} (a component has only the modules imported when it was built: "
                f"import {error.name} at the top of a module of the plugin, then build again)",
                name=error.name,
            ) from None
        raise
    except BaseException:
        forget_job()
        raise
    _pending = None


def _local(directory, name):
    top = name.split(".")[0]
    return os.path.exists(f"{directory}/{top}.py") or os.path.isdir(f"{directory}/{top}")
