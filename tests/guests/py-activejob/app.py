"""PyActiveJob: logs ``seen<<{json}>>`` with the job's class, decoded args,
ActiveJob context and raw ActiveJob hash, for the host's end-to-end tests."""

import json
from dataclasses import asdict

from wasmjobs_guest import WitWorld, activejob, job, log  # noqa: F401 (WitWorld is the component's export)


@job
def perform(info, *args):
    context = activejob.context()
    raw = activejob.raw()
    seen = {
        "class": info.class_name,
        "args": list(args),
        "context": None if context is None else asdict(context),
        "raw": None if raw is None else json.loads(raw),
    }
    log.info("seen<<" + json.dumps(seen) + ">>")
