"""PyAsyncHttpGetJob: PyHttpGetJob for an instance that runs many jobs at
once. Args: [url]. Awaits the GET, so while it waits the instance's other
jobs run; fails (retry) on a non-2xx status."""

from wasmjobs_guest import WitWorld, http, job, log, Retry  # noqa: F401 (WitWorld is the component's export)


@job
async def perform(info, url: str):
    response = await http.get(url)
    log.info(f"GET {url}: {response.status}, {len(response.body)} bytes")
    if not response.ok:
        raise Retry(f"GET {url}: HTTP {response.status}")
