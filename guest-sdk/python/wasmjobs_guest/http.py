"""A small HTTP client: one request, the whole response.

In a plugin built for the ``plugin`` world (the default) each call is
synchronous, over ``wasi:http/outgoing-handler``: while it waits, the job
is a suspended instance on the host, not a thread, so thousands of HTTP
jobs wait concurrently. In a plugin built for the ``async-plugin`` world
(``[instances] concurrent``, an ``async def`` job) the same functions
return awaitables over the one-call ``async-http`` import, so the
instance's other jobs run while one waits: ``await http.get(url)``.

Which hosts a plugin may call is its manifest's ``[http] allow`` list; a
denied host raises :class:`HttpError` like any other transport failure.
"""

import json as _json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from componentize_py_types import Err

try:  # the async-plugin world: one-call requests, awaited
    from wit_world.imports import async_http as _async_http
    from wit_world.imports import http as _one_call
except ImportError:  # the plugin world: wasi:http, synchronous
    _async_http = None
    from wit_world.imports import outgoing_handler, streams
    from wit_world.imports import wasi_http_types as _t

# How much to ask for per read of a response body.
_READ_CHUNK = 64 * 1024

_METHODS = {} if _async_http else {
    "GET": _t.Method_Get,
    "HEAD": _t.Method_Head,
    "POST": _t.Method_Post,
    "PUT": _t.Method_Put,
    "DELETE": _t.Method_Delete,
    "CONNECT": _t.Method_Connect,
    "OPTIONS": _t.Method_Options,
    "TRACE": _t.Method_Trace,
    "PATCH": _t.Method_Patch,
}


class HttpError(Exception):
    """No response: a denied host, a refused connection, a timeout, a bad URL."""


@dataclass
class Response:
    """A complete response."""

    status: int
    headers: list = field(default_factory=list)
    """(name, value) pairs, values decoded as UTF-8 (invalid bytes replaced)."""
    body: bytes = b""

    @property
    def ok(self):
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    @property
    def text(self):
        """The body decoded as UTF-8 (invalid bytes replaced)."""
        return self.body.decode("utf-8", "replace")

    def json(self):
        """The body parsed as JSON."""
        return _json.loads(self.body)

    def header(self, name):
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)


def get(url, headers=None):
    """``GET url``."""
    return request("GET", url, headers=headers)


def post(url, body, headers=None):
    """``POST url`` with ``body`` (bytes, str, or anything JSON-serialisable,
    which is sent as ``application/json``)."""
    return request("POST", url, body=body, headers=headers)


def request(method, url, body=None, headers=None):
    """Sends ``method url`` with optional ``body`` and ``headers`` (a dict or
    (name, value) pairs) and returns the :class:`Response` (an awaitable of
    it in an async plugin). Raises :class:`HttpError` when there is no
    response."""
    what = f"{method} {url}"
    headers = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    if body is not None and not isinstance(body, (bytes, str)):
        body = _json.dumps(body)
        if not any(name.lower() == "content-type" for name, _ in headers):
            headers.append(("content-type", "application/json"))
    if isinstance(body, str):
        body = body.encode("utf-8")
    parts = urlsplit(url)
    if _async_http is not None:
        return _send_async(method, url, body, headers, what, parts)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError(f"{what}: not an http(s) URL")
    return _send(method, body, headers, what, parts)


async def _send_async(method, url, body, headers, what, parts):
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError(f"{what}: not an http(s) URL")
    outgoing = _one_call.Request(
        method=method.upper() if method.upper() in _STANDARD else method,
        url=url,
        headers=[(name, str(value).encode("utf-8")) for name, value in headers],
        body=body or b"",
        timeout_ms=None,
    )
    try:
        response = await _async_http.send(outgoing)
    except Err as error:
        raise HttpError(error.value.value) from None
    decoded = [(name, value.decode("utf-8", "replace")) for name, value in response.headers]
    return Response(status=response.status, headers=decoded, body=bytes(response.body))


_STANDARD = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")


def _send(method, body, headers, what, parts):
    try:
        fields = _t.Fields.from_list([(name, str(value).encode("utf-8")) for name, value in headers])
    except Err as error:
        raise HttpError(f"{what}: invalid header: {error.value}") from None
    outgoing = _t.OutgoingRequest(fields)
    method_class = _METHODS.get(method.upper())
    outgoing.set_method(method_class() if method_class else _t.Method_Other(method))
    outgoing.set_scheme(_t.Scheme_Https() if parts.scheme == "https" else _t.Scheme_Http())
    outgoing.set_authority(parts.netloc)
    outgoing.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    outgoing_body = outgoing.body()
    try:
        future = outgoing_handler.handle(outgoing, None)
    except Err as error:
        raise _failure(error.value, what, parts) from None
    # The body goes out after `handle`, so a body bigger than the host's
    # buffer does not block: the host is already sending it.
    written = _write(outgoing_body, body or b"")
    _t.OutgoingBody.finish(outgoing_body, None)
    with future:
        response = _wait(future, what, parts)
    if written is not None:
        raise HttpError(f"{what}: failed while sending the body: {written}")
    return _read(response, what)


def _write(outgoing_body, data):
    """Writes ``data`` respecting back-pressure; returns an error text or None."""
    if not data:
        return None
    with outgoing_body.write() as stream:
        try:
            rest = memoryview(data)
            while rest:
                permitted = stream.check_write()
                if permitted == 0:
                    with stream.subscribe() as ready:
                        ready.block()
                    continue
                stream.write(bytes(rest[:permitted]))
                rest = rest[permitted:]
            stream.blocking_flush()
        except Err as error:
            return _stream_error(error.value)
    return None


def _wait(future, what, parts):
    while True:
        result = future.get()
        if result is None:
            with future.subscribe() as ready:
                ready.block()
            continue
        if isinstance(result, Err):
            raise HttpError(f"{what}: the response was already taken")
        inner = result.value
        if isinstance(inner, Err):
            raise _failure(inner.value, what, parts)
        return inner.value


def _read(response, what):
    with response:
        status = response.status()
        with response.headers() as fields:
            headers = [(name, value.decode("utf-8", "replace")) for name, value in fields.entries()]
        incoming = response.consume()
        chunks = []
        with incoming.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(_READ_CHUNK))
                except Err as error:
                    if isinstance(error.value, streams.StreamError_Closed):
                        break
                    raise HttpError(f"{what}: failed while reading the body: {_stream_error(error.value)}") from None
        _t.IncomingBody.finish(incoming)
    return Response(status=status, headers=headers, body=b"".join(chunks))


def _stream_error(error):
    if isinstance(error, streams.StreamError_Closed):
        return "the stream was closed"
    code = _t.http_error_code(error.value)
    return _describe(code) if code is not None else error.value.to_debug_string()


def _failure(code, what, parts):
    """The :class:`HttpError` for a request that failed with ``code``; a
    denial names the rule that would grant it."""
    if type(code).__name__ == "ErrorCode_HttpRequestDenied":
        return HttpError(f'{what}: request denied: add "{_rule(parts)}" to [http] allow in wasmjobs.toml')
    return HttpError(f"{what}: {_describe(code)}")


def _rule(parts):
    """The ``[http] allow`` rule that would grant a URL: ``host`` on the
    scheme's default port, ``host:port`` otherwise (as the host says it)."""
    host = parts.netloc.rpartition("@")[2]
    return host.removesuffix(":443" if parts.scheme == "https" else ":80")


def _describe(code):
    """``ErrorCode_HttpRequestDenied()`` → ``HttpRequestDenied``, plus its payload."""
    name = type(code).__name__.removeprefix("ErrorCode_")
    payload = getattr(code, "value", None)
    if name == "HttpRequestDenied":
        return "request denied (host not allowed by the plugin's manifest)"
    return f"{name}: {payload}" if payload not in (None, "") else name
