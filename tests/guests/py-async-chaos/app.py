"""AsyncChaosJob: a test guest for instances that run many jobs at once
(the async-plugin world). Args: [mode, ...]:

- ["get", url]: awaits GET url, logs "<jid> <url> <status>", retries on 5xx;
- ["dead-after", url]: awaits GET url, then fails as dead naming its jid;
- ["count"]: logs "seen: N", N the jobs this instance has started;
- ["trap", url]: awaits GET url, then aborts (a wasm trap);
- ["spin"]: loops forever (for timeouts);
- ["log-flood", n]: logs n lines;
- ["activejob"]: logs "seen<<{json}>>" with the job's ActiveJob context;
- ["sql", db, statement, *params]: awaits the query, logs "<jid> rows <rows>",
  or "<jid> sql <kind>" when it fails;
- ["execute", db, statement, *params]: awaits it, logs "<jid> affected <n>".
"""

import json
import os
from dataclasses import asdict

from wasmjobs_guest import Dead, Retry, WitWorld, activejob, http, job, log, sql  # noqa: F401 (WitWorld is the component's export)
from wasmjobs_guest.sql import SqlError

# Module state, shared by the jobs of one instance.
_seen = 0


@job
async def perform(info, mode, *rest):
    global _seen
    _seen += 1
    if mode == "get":
        response = await http.get(rest[0])
        log.info(f"{info.jid} {rest[0]} {response.status}")
        if response.status >= 500:
            raise Retry(f"{info.jid}: HTTP {response.status}")
    elif mode == "dead-after":
        await http.get(rest[0])
        raise Dead(f"{info.jid} gave up")
    elif mode == "count":
        log.info(f"seen: {_seen}")
    elif mode == "trap":
        await http.get(rest[0])
        os.abort()
    elif mode == "spin":
        while True:
            pass
    elif mode == "sql":
        try:
            result = await sql.query(rest[0], rest[1], *rest[2:])
            log.info(f"{info.jid} rows {result.rows}")
        except SqlError as error:
            log.info(f"{info.jid} sql {error.kind}")
    elif mode == "execute":
        affected = await sql.execute(rest[0], rest[1], *rest[2:])
        log.info(f"{info.jid} affected {affected}")
    elif mode == "log-flood":
        for i in range(rest[0]):
            log.info(f"line {i} of {info.jid}")
    elif mode == "activejob":
        context = activejob.context()
        seen = {"class": info.class_name, "args": [mode, *rest], "context": context and asdict(context)}
        log.info("seen<<" + json.dumps(seen) + ">>")
    else:
        raise Dead(f"unknown mode {mode!r}")
