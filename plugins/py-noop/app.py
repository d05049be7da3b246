"""PyNoopJob: does nothing; what a Python job costs the runner by itself."""

from wasmjobs_guest import WitWorld, job  # noqa: F401 (WitWorld is the component's export)


@job
def perform(info, *args):
    pass
