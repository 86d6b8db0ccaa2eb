"""``--auth FILE``: bearer tokens, stored as SHA-256 digests, and the four roles.

    tokens:
      - {name: alice, sha256: <hex digest of her token>, roles: [approver],
         slack: U024BE7LH, google_chat: users/1234567890}   # (optional: Slack / Google Chat)

A request's token is hashed and compared with every stored digest in constant time
(`hmac.compare_digest`, and every digest is compared whatever matched), so neither a
token nor a digest leaks through timing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from interlock import UsageError

ROLES = ("viewer", "operator", "approver", "admin")

# what each kind of request needs: any role reads; admin may do everything
READ, OPERATE, DECIDE = "read", "operate", "decide"
_NEEDS = {READ: set(ROLES), OPERATE: {"operator", "admin"}, DECIDE: {"approver", "admin"}}
# a chat's users mapped to entries: the key, and what its ids look like
CHATS = {"slack": "a Slack member ID, U…", "google_chat": "users/… as Google Chat names them"}
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is from: a token's name and roles (``local`` without ``--auth``)."""

    name: str
    roles: tuple[str, ...]
    authenticated: bool = True

    def may(self, what: str) -> bool:
        return bool(_NEEDS[what] & set(self.roles))


LOCAL = Identity("local", ("admin",), authenticated=False)


@dataclass(frozen=True, slots=True)
class _Token:
    name: str
    digest: str
    roles: tuple[str, ...]
    chats: tuple[tuple[str, str], ...] = ()  # (slack | google_chat, the chat's user id)


class Tokens:
    """The tokens of an ``--auth`` file."""

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        where = f"--auth {path}"
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read {where}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise UsageError(f"{where} is not valid YAML: {exc}") from None
        example = ("expected 'tokens: [{name: alice, sha256: <hex digest of the token>, "
                   "roles: [approver]}]' (a digest: printf %s TOKEN | sha256sum)")
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            raise UsageError(f"{where}: {example}")
        tokens: list[_Token] = []
        for i, item in enumerate(data["tokens"], 1):
            tokens.append(_entry(item, f"{where}: token {i}", example))
        names = [t.name for t in tokens]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise UsageError(f"{where}: the token name(s) {', '.join(twice)} appear more than "
                             "once; each token names one identity")
        if not tokens:
            raise UsageError(f"{where} lists no tokens: {example}")
        return cls(tokens)

    def identify(self, token: str) -> Identity | None:
        """The identity of ``token``, or None. Every stored digest is compared."""
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        found: _Token | None = None
        for t in self._tokens:
            if hmac.compare_digest(digest, t.digest):
                found = t
        return None if found is None else Identity(found.name, found.roles)

    def chat_user(self, chat: str, user: str) -> Identity | None:
        """The identity a chat's user maps to (``slack: U…`` or ``google_chat: users/…``
        on an entry), or None."""
        key = "google_chat" if chat == "google-chat" else chat
        for t in self._tokens:
            if (key, user) in t.chats:
                return Identity(t.name, t.roles)
        return None


def _entry(item: object, where: str, example: str) -> _Token:
    if not isinstance(item, dict):
        raise UsageError(f"{where} is not a mapping; {example}")
    unknown = sorted(set(item) - {"name", "sha256", "roles", *CHATS})
    if unknown:
        raise UsageError(f"{where} has unknown key(s) {', '.join(unknown)}; {example}")
    name, digest, roles = item.get("name"), item.get("sha256"), item.get("roles")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where} needs a name; {example}")
    if name.startswith("role:"):
        raise UsageError(f"{where}: the name {name!r} starts with 'role:', which approvers: "
                         "uses for roles (approvers: [role:admin] would let this token "
                         "decide as if it had the role); choose another name")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest.lower()):
        raise UsageError(f"{where} ({name}): sha256 must be the 64 hex digits of the token's "
                         "SHA-256 digest (printf %s TOKEN | sha256sum), never the token itself")
    if not isinstance(roles, list) or not roles or \
            not all(isinstance(r, str) and r in ROLES for r in roles):
        raise UsageError(f"{where} ({name}): roles must be a list of {', '.join(ROLES)}; got "
                         f"{roles!r}")
    chats = []
    for key in CHATS:
        if key in item:
            if not isinstance(item[key], str) or not item[key].strip():
                raise UsageError(f"{where} ({name}): {key} must be the user's id in the chat "
                                 f"({CHATS[key]}); got {item[key]!r}")
            chats.append((key, item[key].strip()))
    return _Token(name, digest.lower(), tuple(roles), tuple(chats))
