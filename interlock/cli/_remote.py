"""``--server URL [--token T]``: runs, status, trace, resume and cancel against an
``interlock serve`` instead of a store, with the same output and exit codes.

The server's refusals (problem+json) become `CliError` with the server's message, which
is the one the command gives against a store (exit 2). A resume or a decision returns
once the server has recorded it; the command then follows the run's event stream until
the run stops (or waits again), as a local resume runs until then.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import click

from ._common import CliError

if TYPE_CHECKING:
    from .. import RunResult, Verification
    from ..support import RunRow

F = TypeVar("F", bound=Callable[..., Any])

STOPS = {"run.completed", "run.failed", "run.rejected", "run.cancelled", "run.waiting"}
RECORDS_PAGE = 10_000  # records per request when the CLI reads a log through a server


def server_options(fn: F) -> F:
    fn = click.option(
        "--token", "token", envvar="INTERLOCK_TOKEN", metavar="TOKEN",
        help="The bearer token for --server (default: $INTERLOCK_TOKEN).")(fn)
    return click.option(
        "--server", "server_url", envvar="INTERLOCK_SERVER", metavar="URL",
        help="Talk to an `interlock serve` at URL instead of a store "
             "(default: $INTERLOCK_SERVER).")(fn)


class Remote:
    """A client of one server."""

    def __init__(self, url: str, token: str | None, store_url: str | None = None) -> None:
        if store_url is not None:
            raise CliError("use either --store or --server (INTERLOCK_SERVER), not both: a "
                           "server has its own store")
        try:
            import httpx
        except ImportError as exc:
            from ..support import install_hint

            raise CliError(f"--server needs httpx: {install_hint('server')} ({exc})"
                           ) from None
        self.url = base_url(url)
        self.given = url  # (as given: a printed command repeats it, `where_options`)
        self.token = token  # (a printed follow-up command says --token TOKEN)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._httpx = httpx
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def _fail(self, exc: Exception) -> CliError:
        if self.url.startswith("https://") and _plain_http(exc):
            plain = "http://" + self.url.removeprefix("https://")
            return CliError(f"the server at {self.url} answers plain HTTP, not HTTPS: use "
                            f"--server {plain} (`interlock serve` speaks plain HTTP; put a "
                            "TLS proxy in front of it for https)")
        return CliError(f"cannot reach the interlock server at {self.url}: {exc}")

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, path, **kwargs)
        except self._httpx.HTTPError as exc:
            raise self._fail(exc) from None
        if response.is_success:
            return self._json(response)
        raise self._refused(response)

    def _json(self, response: Any) -> Any:
        """A successful answer's JSON; one that is not JSON came from something else
        than `interlock serve` (a proxy's or a sign-in page, another server)."""
        if _media(response) in _JSON:
            try:
                return response.json()
            except ValueError:
                pass
        raise self._not_interlock(response)

    def _not_interlock(self, response: Any, what: str = "") -> CliError:
        media = _media(response) or "no content type"
        return CliError(f"{response.request.url} answered {response.status_code} with "
                        f"{media}{what}, not interlock's JSON: {self._base_hint()}")

    def _base_hint(self) -> str:
        url = self._httpx.URL(self.url)
        path = url.path.rstrip("/")
        if path:
            root = str(url.copy_with(path="/", query=None, fragment=None)).rstrip("/")
            return (f"--server ends in a path, {path!r}: give the server's base URL, "
                    f"{root} (its routes start at /api/...), unless a reverse proxy "
                    "forwards that path to the server's root")
        return ("is --server the base URL of `interlock serve` (the address it prints, "
                "such as http://127.0.0.1:8765)?")

    def _refused(self, response: Any) -> CliError:
        """The server's refusal (problem+json) as a `CliError` with its detail; an answer
        that is not one of interlock's names the URL and what --server should be."""
        try:
            body = response.json() if _media(response) in _JSON else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._not_interlock(response, f" ({response.reason_phrase})")
        detail = str(body.get("detail") or "")
        if detail in ("", response.reason_phrase):  # no route there: not interlock's own
            older = "" if self._httpx.URL(self.url).path.rstrip("/") else (
                " (A server of an older interlock lacks some of the routes this CLI "
                "asks for.)")
            error = CliError(f"{response.request.url} answered {response.status_code} "
                             f"{response.reason_phrase}, with no word of interlock's: "
                             f"{self._base_hint()}{older}")
        elif response.status_code == 404 and isinstance(body.get("run_id"), str):
            from ._format import where_options  # (the runs to list: the server's, here)

            error = CliError(f"no run {body['run_id']!r} in the store of the server at "
                             f"{self.url} (list its runs with `interlock runs"
                             f"{where_options(None, self.given, self.token)}`)")
        else:
            error = CliError(detail)
        error.problem = body  # (its extension members: a refused migration's findings)
        return error

    def records(self, run_id: str, after: int = 0) -> list[dict[str, Any]]:
        """The whole log after ``after``, a page (`RECORDS_PAGE`) per request."""
        out: list[dict[str, Any]] = []
        while True:
            page: list[dict[str, Any]] = self.call(
                "GET", f"/api/runs/{run_id}/records",
                params={"after": after, "limit": RECORDS_PAGE})
            with self._ours(f"/api/runs/{run_id}/records"):
                if not all(isinstance(r, dict) and {"seq", "type", "at"} <= r.keys()
                           for r in page):
                    raise TypeError("not records")
                out += page
                if len(page) < RECORDS_PAGE:  # (a server without limit= sent all of it)
                    return out
                after = page[-1]["seq"]

    def follow(self, run_id: str, after: int) -> None:
        """Until the run stops or waits (a record in `STOPS` after ``after``)."""
        try:
            with self.client.stream("GET", f"/api/runs/{run_id}/events",
                                    params={"after": after}, timeout=None) as response:
                if not response.is_success:
                    response.read()
                    raise self._refused(response)
                for line in _events(response.iter_lines()):
                    if line in STOPS:
                        return
        except self._httpx.HTTPError as exc:
            raise self._fail(exc) from None

    def result(self, run_id: str) -> RunResult:
        from .. import RunResult

        body = self.call("GET", f"/api/runs/{run_id}")
        with self._ours(f"/api/runs/{run_id}"):
            return RunResult(**body)

    def row(self, run_id: str, result: RunResult, records: list[dict[str, Any]]) -> RunRow:
        """A run's row as far as a client can tell it (`interlock status` shows it):
        created and updated from its first and last records, its parent from run.forked."""
        from ..support import RunRow, Summary

        forked = next((r for r in records if r["type"] == "run.forked"), {})
        first = records[0]["at"] if records else 0.0
        last = records[-1]["at"] if records else 0.0
        return RunRow(run_id=run_id, workflow=result.workflow, definition={},
                      definition_hash="", input={}, options={}, created_at=first,
                      summary=Summary(status=result.status, last_seq=len(records),
                                      last_hash="", steps=result.steps, tokens=result.tokens,
                                      error=result.error, waiting=result.waiting,
                                      updated_at=last),
                      parent_run=forked.get("parent_run"), parent_seq=forked.get("parent_seq"))

    def rows(self, *, status: str | None, workflow: str | None, limit: int) -> list[RunRow]:
        params = {k: v for k, v in {"status": status, "workflow": workflow,
                                    "limit": min(limit, 1000)}.items() if v is not None}
        page = self.call("GET", "/api/runs", params=params)
        with self._ours("/api/runs"):
            return self._rows(page)

    @staticmethod
    def _rows(page: Any) -> list[RunRow]:
        from ..support import RunRow, Summary

        return [RunRow(run_id=r["run_id"], workflow=r["workflow"], definition={},
                       definition_hash="", input={}, options={}, created_at=r["created_at"],
                       summary=Summary(status=r["status"], last_seq=0, last_hash="",
                                       steps=r["steps"], tokens=r["tokens"], error=r["error"],
                                       waiting=r["waiting"], updated_at=r["updated_at"]),
                       parent_run=r["parent_run"], parent_seq=r["parent_seq"])
                for r in page["runs"]]

    def decide(self, run_id: str, decision: Any) -> None:
        body = {"decision": decision.kind, "comment": decision.comment, "by": decision.by,
                "patch": decision.patch or None, "at": decision.at, "node": decision.node,
                "data": decision.data, "via": decision.via}
        self.call("POST", f"/api/runs/{run_id}/decisions",
                  json={k: v for k, v in body.items() if v is not None})

    def verification(self, run_id: str) -> Verification:
        """The server's `interlock.verify` of the run, in its own store with its key."""
        from .. import Verification

        body = self.call("GET", f"/api/runs/{run_id}/verify")
        with self._ours(f"/api/runs/{run_id}/verify"):
            return Verification(**{**body, "notes": tuple(body.get("notes") or ()),
                                   "children": tuple(body.get("children") or ())})

    def export(self, run_id: str, out: BinaryIO) -> None:
        """Write the server's export of the run (`interlock export`'s bytes) to ``out``
        as they arrive."""
        path = f"/api/runs/{run_id}/export"
        written = 0
        try:
            with self.client.stream("GET", path, timeout=None) as response:
                if not response.is_success:
                    response.read()
                    raise self._refused(response)
                if _media(response) != "application/jsonl":
                    response.read()
                    raise self._not_interlock(response)
                for chunk in response.iter_bytes():
                    out.write(chunk)
                    written += len(chunk)
        except self._httpx.HTTPError as exc:
            if not written:
                raise self._fail(exc) from None
            raise CliError(f"the export of {run_id} from {self.url} was cut off after "
                           f"{written} bytes ({exc}): what was written is not the whole "
                           "run (`interlock verify --file` refuses it); export it again"
                           ) from None

    @contextlib.contextmanager
    def _ours(self, path: str) -> Iterator[None]:
        """An answer of the JSON's shape interlock sends, else `CliError` naming it."""
        try:
            yield
        except (KeyError, TypeError, AttributeError, IndexError):
            raise CliError(f"{self.url}{path} answered JSON that is not what interlock "
                           f"sends there: {self._base_hint()}") from None

    def close(self) -> None:
        self.client.close()


_JSON = ("application/json", "application/problem+json")
_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


def _plain_http(exc: BaseException) -> bool:
    """Whether ``exc`` is a TLS handshake that got a plain HTTP answer (an ``https://``
    URL of a server that speaks http)."""
    import ssl

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and (
                seen.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST")
                or "WRONG_VERSION_NUMBER" in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return "WRONG_VERSION_NUMBER" in str(exc)


def _media(response: Any) -> str:
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower()


def base_url(url: str) -> str:
    """--server's URL without a trailing slash. One without a scheme (``127.0.0.1:8765``)
    is taken as ``http://`` on a loopback host, as `interlock serve` prints it; for any
    other host the scheme is asked for (plain http would send the token in clear)."""
    url = url.strip().rstrip("/")
    if "://" in url:
        return url
    host = url.split("/", 1)[0].rsplit(":", 1)[0] if not url.startswith("[") \
        else url.split("]", 1)[0] + "]"
    if host in _LOOPBACK or host.startswith("127."):
        return f"http://{url}"
    raise CliError(f"--server {url!r} has no scheme: give the base URL `interlock serve` "
                   f"answers at, https://{url} (or http://{url} on a network you trust: a "
                   "token is sent in clear over http)")


def _events(lines: Iterator[str]) -> Iterator[str]:
    """The ``event:`` of each event of an SSE stream."""
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif not line and event is not None:
            yield event
            event = None


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
