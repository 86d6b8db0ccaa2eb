"""``interlock serve``: the HTTP API, from `interlock.server`."""

from __future__ import annotations

import click

from ._common import CliError, store_option


@click.command(short_help="Serve the HTTP API and live events.")
@store_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; a non-loopback one needs --auth.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--workflows", "workflows", multiple=True, metavar="PATH",
              help="A workflow file, or a folder searched with its subfolders for "
                   "*.yaml/*.yml/*.json files with a top-level workflow: key -- other files "
                   "are skipped with a log line (repeatable); each is known by its "
                   "workflow: name.")
@click.option("--allow-empty", is_flag=True,
              help="Start even when --workflows finds no workflow (to serve the store's "
                   "runs, whose definitions they keep).")
@click.option("--auth", "auth", metavar="FILE",
              help="YAML: tokens: [{name, sha256, roles}] (roles: viewer, operator, "
                   "approver, admin).")
@click.option("--notify", "notify", multiple=True, metavar="URL",
              help="POST a Slack-compatible message here on every approval request "
                   "(repeatable).")
@click.option("--notify-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True,
              help="Seconds one notification attempt may take in all (its answer's body "
                   "is never read).")
@click.option("--public-url", metavar="URL",
              help="Where the server is reached, for links in notifications "
                   "(default http://HOST:PORT).")
@click.option("--slack-channel", metavar="C...",
              help="Post each gate to this Slack channel with Approve / Reject buttons "
                   "(SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET from the environment; "
                   "clicks come to /api/integrations/slack/actions).")
@click.option("--google-chat-space", metavar="spaces/...",
              help="Post each gate to this Google Chat space as a Chat app "
                   "(GOOGLE_CHAT_CREDENTIALS: a service account's JSON key; clicks come to "
                   "/api/integrations/google-chat/events).")
@click.option("--google-chat-audience", metavar="AUD",
              help="The audience of Google Chat's tokens: the app's project number or "
                   "endpoint URL.")
@click.option("--google-chat-keys", metavar="FILE",
              help="A JWKS file of the keys Google Chat's tokens are checked against "
                   "(default: Google's published keys).")
@click.option("--chat-attempts", type=click.IntRange(min=1), default=6, show_default=True,
              help="Attempts at most of one Slack / Google Chat post or update that "
                   "fails (no answer, HTTP 429 or 5xx), each recorded.")
@click.option("--chat-backoff", type=click.FloatRange(min=0), default=1.0,
              show_default=True,
              help="Seconds before a failed post or update is tried again, doubled for "
                   "each next attempt (at most 300), unless the chat's Retry-After says.")
@click.option("--workers", type=click.IntRange(min=0), default=4, show_default=True,
              help="Runs executing at a time; more wait for a free worker. 0: execute "
                   "nothing -- starts, decisions and resumes are only recorded (PENDING) "
                   "for `interlock worker` processes on the same store.")
@click.option("--poll", type=click.FloatRange(min=0.01), default=0.25, show_default=True,
              help="Seconds between reads of a followed run that another process writes.")
@click.option("--drain", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="On SIGTERM, seconds to let executing runs end before stopping them.")
@click.option("--take-over/--no-take-over", default=True, show_default=True,
              help="On start, continue the runs whose executing process is gone.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A Host name the server answers to besides the loopback names and "
                   "--host (repeatable): the name a reverse proxy forwards. With --auth, "
                   "Host is checked only when one is given.")
@click.option("--max-connections", type=click.IntRange(min=1), default=1000,
              show_default=True,
              help="Open connections at most (fewer when the descriptor limit is lower); "
                   "past it the longest idle one is closed.")
@click.option("--keep-alive", type=click.IntRange(min=1), default=5, show_default=True,
              help="Seconds an idle connection is kept open between requests.")
@click.option("--head-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True,
              help="Seconds a client has to send a whole request line and headers.")
@click.option("--strict-code", is_flag=True,
              help="Refuse (exit 2, nothing recorded) to continue a run whose nodes' code "
                   "changed since it started, instead of warning and recording "
                   "run.code_changed.")
def serve(store_url: str | None, host: str, port: int, workflows: tuple[str, ...],
          allow_empty: bool, auth: str | None, notify: tuple[str, ...], notify_timeout: float,
          public_url: str | None, workers: int,
          poll: float, drain: float, take_over: bool, allowed_hosts: tuple[str, ...],
          max_connections: int, keep_alive: int, head_timeout: float,
          strict_code: bool, slack_channel: str | None, google_chat_space: str | None,
          google_chat_audience: str | None, google_chat_keys: str | None,
          chat_attempts: int, chat_backoff: float) -> None:
    """Serve the API, the run event streams and approvals from one process. Runs started
    through it execute in it; runs another process left unfinished are taken over."""
    try:
        from ..server import ServerOptions
        from ..server import serve as run_server
    except ImportError as exc:
        from ..support import install_hint

        raise CliError(f"interlock serve needs the server extra: {install_hint('server')} "
                       f"({exc})") from None
    from .. import StoreError, UsageError
    from ..support import set_strict_code

    for flag, url in [*(("--notify", u) for u in notify), ("--public-url", public_url)]:
        _check_url(flag, url)
    set_strict_code(True if strict_code else None)  # (None: as $INTERLOCK_STRICT_CODE says)
    options = ServerOptions(store=store_url, workflows=workflows, auth=auth, notify=notify,
                            notify_timeout=notify_timeout,
                            public_url=public_url or f"http://{host}:{port}",
                            workers=workers, poll=poll, drain=drain, take_over=take_over,
                            host=host, allowed_hosts=allowed_hosts,
                            slack_channel=slack_channel,
                            google_chat_space=google_chat_space,
                            google_chat_audience=google_chat_audience,
                            google_chat_keys=google_chat_keys,
                            chat_attempts=chat_attempts, chat_backoff=chat_backoff)
    try:
        run_server(options, host=host, port=port, max_connections=max_connections,
                   keep_alive=keep_alive, head_timeout=head_timeout,
                   allow_empty=allow_empty)
    except (UsageError, StoreError) as exc:
        raise CliError(str(exc)) from None


def _check_url(flag: str, url: str | None) -> None:
    """A URL option checked before anything starts (a webhook that can never be posted
    to would otherwise show only at the first gate, in the log)."""
    from urllib.parse import urlsplit

    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"{flag} {url!r} is not an http:// or https:// URL: give the whole "
                       "address, such as https://hooks.example.com/T0/B0/X (--notify) or "
                       "https://interlock.example.com (--public-url)")
