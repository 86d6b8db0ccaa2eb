"""Google Chat as a Chat app: a card per gate posted (``POST
/v1/{space}/messages``) and updated (``PATCH`` of the message) through the Chat API with a
service account's token (``google-auth``; the key's ``token_uri`` honoured), and the
clicks Google Chat sends (``CARD_CLICKED`` events) verified as Google signs them: an RS256
JWT whose audience is the app's (``--google-chat-audience``), whose issuer (or, for an
endpoint-URL audience, ``email``) is ``chat@system.gserviceaccount.com``, unexpired,
checked with PyJWT against ``--google-chat-keys FILE`` (a JWKS) or Google's published keys.

(An incoming webhook is one-way: a click on a card it posted never reaches the app.)
``GOOGLE_CHAT_API_URL`` replaces the API's base URL (tests use a local one).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from interlock import UsageError
from interlock.support import gate_text, install_hint

from ._deliveries import retry_after
from ._notify import decided_text, outcome_lines, payload
from ._slack import UNKNOWN_LABELS

CHAT_ISSUER = "chat@system.gserviceaccount.com"
SCOPES = ["https://www.googleapis.com/auth/chat.bot"]
# Google's published keys: of the Chat app tokens (a project-number audience), and of
# Google's ID tokens (an endpoint-URL audience)
CHAT_KEYS = f"https://www.googleapis.com/service_accounts/v1/jwk/{CHAT_ISSUER}"
ID_TOKEN_KEYS = "https://www.googleapis.com/oauth2/v3/certs"
ID_TOKEN_ISSUERS = ("https://accounts.google.com", "accounts.google.com")
FUNCTION = "interlock.decide"
TIMEOUT = 10.0


class NotVerified(Exception):
    """A request whose bearer token does not verify (answered 401)."""


@dataclass(frozen=True, slots=True)
class Event:
    """A verified CARD_CLICKED event on one of our buttons."""

    user: str  # users/…
    run_id: str
    gate: str
    decision: str
    request: int | None = None  # the seq of the asking it was posted for (None: an old card)


class GoogleChat:
    name = "google-chat"

    def __init__(self, space: str, credentials: dict[str, Any], audience: str | None,
                 keys: dict[str, Any] | None, api_url: str | None = None) -> None:
        from google.oauth2 import service_account

        self.space, self.audience, self.keys = space, audience, keys
        self.api_url = (api_url or "https://chat.googleapis.com").rstrip("/")
        # the key's token_uri is where the token is asked for (google-auth reads it)
        self.credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            credentials, scopes=SCOPES)
        self._client: httpx.AsyncClient | None = None
        self._jwks: dict[str, Any] = {}  # URL: PyJWKClient

    @classmethod
    def from_options(cls, space: str | None, audience: str | None,
                     keys_file: str | None) -> GoogleChat | None:
        if not space:
            return None
        where = f"--google-chat-space {space}"
        if not space.startswith("spaces/"):
            raise UsageError(f"{where}: a space is named spaces/… (the space's URL ends "
                             "with its id)")
        raw = os.environ.get("GOOGLE_CHAT_CREDENTIALS")
        if not raw:
            raise UsageError(f"{where} needs GOOGLE_CHAT_CREDENTIALS: the path of the Chat "
                             "app's service account JSON key (docs/server.md)")
        try:
            text = raw if raw.lstrip().startswith("{") else \
                Path(raw).read_text(encoding="utf-8")
            info = json.loads(text)
        except (OSError, ValueError) as exc:
            raise UsageError(f"GOOGLE_CHAT_CREDENTIALS: cannot read the service account "
                             f"key: {exc}") from None
        keys = None
        if keys_file:
            try:
                keys = json.loads(Path(keys_file).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UsageError(f"--google-chat-keys {keys_file}: cannot read a JWKS "
                                 f"document: {exc}") from None
            if not isinstance(keys, dict) or not isinstance(keys.get("keys"), list):
                raise UsageError(f"--google-chat-keys {keys_file}: expected a JWKS "
                                 "document, {\"keys\": [...]}")
        try:
            return cls(space, info, audience, keys, os.environ.get("GOOGLE_CHAT_API_URL"))
        except ImportError:
            raise UsageError("--google-chat-space needs google-auth and PyJWT: "
                             f"{install_hint('chat')}") from None
        except (ValueError, KeyError) as exc:
            raise UsageError(f"GOOGLE_CHAT_CREDENTIALS is not a service account key: "
                             f"{exc}") from None

    # -- cards -------------------------------------------------------------------------

    def message(self, workflow: str, run_id: str, gate: str, rec: dict[str, Any],
                public_url: str) -> dict[str, Any]:
        base = payload(workflow, run_id, rec, public_url)
        link = base["blocks"][-1]["elements"][0]["url"]
        widgets: list[dict[str, Any]] = [{"textParagraph": {
            "text": f"Run <b>{_html(run_id)}</b> is waiting for a decision at "
                    f"<b>{_html(gate)}</b>"}}]
        unknown = outcome_lines(rec)
        if unknown:  # approving runs the action again: said before anything else
            head, *rest = (_html(line) for line in unknown)
            widgets.append({"textParagraph": {"text": _short(
                f"<b>{head.replace(': ', ':</b> ', 1)}<br>" + "<br>".join(
                    f"• {line}" for line in rest), 4000)}})
        for key, value in list(gate_text.shown(rec).items())[:10]:
            widgets.append({"decoratedText": {"topLabel": _html(str(key)),
                                              "text": _html(_short(json.dumps(
                                                  value, default=str)))}})
        labels = UNKNOWN_LABELS if unknown else {"approve": "Approve", "reject": "Reject"}
        buttons = []
        # which asking of the gate the card is for (its approval.requested's seq): a
        # click decides only that one (`_chat.ChatApprovals.clicked`)
        asked = [{"key": "request", "value": str(rec["seq"])}] \
            if rec.get("seq") is not None else []
        for kind in ("approve", "reject"):
            buttons.append({"text": labels[kind], "onClick": {"action": {
                "function": FUNCTION, "parameters": [
                    {"key": "run_id", "value": run_id}, {"key": "gate", "value": gate},
                    {"key": "decision", "value": kind}, *asked]}}})
        buttons.append({"text": "Open in the dashboard",
                        "onClick": {"openLink": {"url": link}}})
        widgets.append({"buttonList": {"buttons": buttons}})
        text = f"{workflow}: run {run_id} is waiting for a decision at {gate}"
        subtitle = "waiting for a decision"
        if unknown:
            text, subtitle = f"{text}: {gate_text.headline(rec)}", "OUTCOME UNKNOWN"
        return {"text": text,
                "cardsV2": [{"cardId": "interlock-gate", "card": {
                    "header": {"title": workflow, "subtitle": subtitle},
                    "sections": [{"widgets": widgets}]}}]}

    @staticmethod
    def decided(message: dict[str, Any], decided: dict[str, Any], headline: str
                ) -> dict[str, Any]:
        """The card once the gate is decided: its first line and subtitle say so
        (``headline``, `_notify.decided_headline`), the buttons are replaced by who and
        when."""
        card = json.loads(json.dumps(message["cardsV2"][0]))
        widgets = [w for w in card["card"]["sections"][0]["widgets"] if "buttonList" not in w]
        widgets[0] = {"textParagraph": {"text": _html(headline)}}
        widgets.append({"textParagraph": {"text": f"<i>{_html(decided_text(decided))}</i>"}})
        card["card"]["sections"][0]["widgets"] = widgets
        card["card"]["header"]["subtitle"] = f"decided: {decided.get('decision')}"
        return {"text": headline, "cardsV2": [card]}

    # -- the Chat API --------------------------------------------------------------------

    async def _token(self) -> str:
        if not self.credentials.valid:
            from google.auth.transport.requests import Request

            await asyncio.to_thread(self.credentials.refresh, Request())
        return str(self.credentials.token)

    async def post(self, message: dict[str, Any]) -> tuple[dict[str, object], dict[str, object]]:
        return await self._call("POST", f"/v1/{self.space}/messages", message)

    async def update(self, where: dict[str, Any], message: dict[str, Any]
                     ) -> tuple[dict[str, object], dict[str, object]]:
        return await self._call("PATCH", f"/v1/{where['name']}", message,
                                {"updateMask": "text,cardsV2"})

    async def _call(self, method: str, path: str, body: dict[str, Any],
                    params: dict[str, str] | None = None
                    ) -> tuple[dict[str, object], dict[str, object]]:
        what = f"{method} {path}"
        try:
            token = await self._token()
        except Exception as exc:  # google-auth's RefreshError, TransportError, ...
            return {"method": what, "error": f"no token: {type(exc).__name__}: {exc}"}, {}
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT)
        try:
            response = await self._client.request(
                method, self.api_url + path, json=body, params=params,
                headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            return {"method": what, "error": f"{type(exc).__name__}: {exc}"}, {}
        if not response.is_success:
            outcome: dict[str, object] = {"method": what, "status": response.status_code}
            wait = retry_after(response.headers.get("retry-after"))
            if wait is not None:
                outcome["retry_after"] = wait
            return outcome, {}
        try:
            name = response.json().get("name")
        except ValueError:
            name = None
        return {"method": what, "status": response.status_code}, \
            ({"name": name} if name else {})

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    # -- events from Google Chat -------------------------------------------------------

    async def verify(self, authorization: str | None) -> None:
        """Raise `NotVerified` unless ``authorization`` is a bearer JWT Google Chat signed
        for this app."""
        import jwt

        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotVerified("no bearer token")
        if not self.audience:
            raise NotVerified("the server has no --google-chat-audience to check tokens "
                              "against")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") != "RS256":
                raise NotVerified(f"the token's algorithm is {header.get('alg')!r}, not RS256")
            key = await self._key(token, header)
            claims = jwt.decode(token, key, algorithms=["RS256"], audience=self.audience,
                                options={"require": ["exp", "aud", "iss"]}, leeway=30)
        except jwt.PyJWTError as exc:
            raise NotVerified(f"{type(exc).__name__}: {exc}") from None
        if claims.get("iss") == CHAT_ISSUER:
            return
        if self.audience.startswith(("http://", "https://")) and \
                claims.get("iss") in ID_TOKEN_ISSUERS and claims.get("email") == CHAT_ISSUER \
                and claims.get("email_verified", True):
            return
        raise NotVerified(f"the token's issuer is {claims.get('iss')!r}, not {CHAT_ISSUER}")

    async def _key(self, token: str, header: dict[str, Any]) -> Any:
        import jwt

        if self.keys is not None:
            kid = header.get("kid")
            for jwk in jwt.PyJWKSet.from_dict(self.keys).keys:
                if kid is None or jwk.key_id == kid:
                    return jwk.key
            raise NotVerified(f"no key {kid!r} in --google-chat-keys")
        url = ID_TOKEN_KEYS if self.audience and \
            self.audience.startswith(("http://", "https://")) else CHAT_KEYS
        client = self._jwks.setdefault(url, jwt.PyJWKClient(url, cache_keys=True,
                                                            timeout=int(TIMEOUT)))
        return (await asyncio.to_thread(client.get_signing_key_from_jwt, token)).key

    @staticmethod
    def event(body: bytes) -> Event | None:
        """Our button's click in a verified event (None: another event)."""
        try:
            data = json.loads(body)
            if data.get("type") != "CARD_CLICKED":
                return None
            action = data.get("action") or {}
            params = {p["key"]: p["value"] for p in action.get("parameters") or []}
            params |= (data.get("common") or {}).get("parameters") or {}
            if action.get("actionMethodName", FUNCTION) != FUNCTION and \
                    (data.get("common") or {}).get("invokedFunction") != FUNCTION:
                return None
            request = params.get("request")
            return Event(str(data["user"]["name"]), str(params["run_id"]),
                         str(params["gate"]), str(params["decision"]),
                         None if request is None else int(request))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    @staticmethod
    def reply(event: Event, text: str) -> dict[str, Any]:
        """The answer to a refused click: a message only the clicking user sees."""
        return {"actionResponse": {"type": "NEW_MESSAGE"},
                "privateMessageViewer": {"name": event.user}, "text": text}


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"

