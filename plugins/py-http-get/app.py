"""PyHttpGetJob: the HttpGetJob workload in Python. Args: [url]. GETs the
URL and fails (retry) on a non-2xx status."""

from wasmjobs_guest import WitWorld, http, job, log, Retry  # noqa: F401 (WitWorld is the component's export)


@job
def perform(info, url):
    response = http.get(url)
    log.info(f"GET {url}: {response.status}, {len(response.body)} bytes")
    if not response.ok:
        raise Retry(f"GET {url}: HTTP {response.status}")
