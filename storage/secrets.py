"""Passwords in store URIs: parsed out of the URI (not matched by a pattern), percent-escaped for the
database driver, and hidden in everything privbench prints. It imports nothing of privbench, so that
`storage.errors` (which masks driver messages) and `storage.location` (which parses URIs) both use it."""

from __future__ import annotations

import re
import urllib.parse

_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]*)@")
_SECRETS: set[str] = set()  # passwords of the URIs this process parsed: masked wherever they appear
MIN_SECRET_LEN = 3  # shorter ones are masked inside URIs only (replacing "ab" everywhere garbles messages)


def split_credentials(uri: str) -> tuple[str, str, str | None, str]:
    """`scheme://user:password@rest` -> (scheme, user, password, rest), percent-escapes decoded.

    The credentials end at the *last* `@` and the user at the first `:`, so a password may hold `/`, `@`,
    `#`, `:`, `?` or spaces unescaped (a URL parser would cut it at the first of them and take the rest
    for the host). A password that is already percent-escaped is decoded once, as SQLAlchemy does; a `%`
    that does not start a valid escape (`100%`, `per%cent`) is kept as it is."""
    scheme, _, rest = uri.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return scheme, "", None, rest
    user, colon, password = userinfo.partition(":")
    return scheme, _unescape(user), _unescape(password) if colon else None, host


def _unescape(text: str) -> str:
    try:
        return urllib.parse.unquote(text, errors="strict")
    except UnicodeDecodeError:  # not an escape someone meant: the text as typed
        return text


def join_credentials(scheme: str, user: str, password: str | None, rest: str, *, hide: bool = False) -> str:
    """The inverse of `split_credentials`, with user and password percent-escaped (`***` when `hide`)."""
    if not user and password is None:
        return f"{scheme}://{rest}"
    secret = "" if password is None else ":" + ("***" if hide else urllib.parse.quote(password, safe=""))
    return f"{scheme}://{urllib.parse.quote(user, safe='')}{secret}@{rest}"


def remember_secret(password: str | None) -> None:
    if password:
        _SECRETS.update({password, urllib.parse.quote(password, safe=""), urllib.parse.quote(password)})


def mask_uri(uri: str) -> str:
    """A URI as messages show it: the password parsed out (not matched by a pattern) and shown as `***`."""
    if "://" not in uri:
        return uri
    scheme, user, password, rest = split_credentials(uri)
    remember_secret(password)
    return join_credentials(scheme, user, password, rest, hide=True) if password is not None else uri


def mask(text: str) -> str:
    """Hide every password in `text` (URIs and driver errors end up in messages): the passwords of the URIs
    this process parsed wherever they appear, then any other `scheme://user:password@` left."""
    text = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LEN:
            text = text.replace(secret, "***")
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
