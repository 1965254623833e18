"""Keeping credentials out of errors: the secrets an option holds, and a stand-in for a
third-party exception whose text (or whose chain's text) shows one.

Some SDKs put a credential in their own error text (google-auth checks an access token at
``.../tokeninfo?access_token=<token>`` and ``requests`` quotes that URL when the check fails).
Such an exception is never chained or quoted as it is: the error commitstore raises says the
same thing with every secret replaced by ``***``, and its ``__cause__`` is a
:class:`RedactedError` carrying the original's type name and redacted text, not the original.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

MASK = "***"

NOT_SECRET = frozenset({"anon", "google_default", "cache", "cloud", "browser", "true", "false"})
"""Values of a ``token=`` option that name a way to find credentials rather than hold one."""

MIN_SECRET = 6
"""Shorter strings are not treated as secrets (they would mask ordinary words)."""


class RedactedError(Exception):
    """Stands in, as ``__cause__``, for a third-party exception whose text held a credential:
    ``"<original type>: <original text with secrets masked>"``."""


def secret_values(value: object) -> tuple[str, ...]:
    """Every string inside a credential option (a token, a dict of service-account fields, a
    credentials object's ``token``) that must never be shown, longest first."""
    found: list[str] = []

    def visit(v: object) -> None:
        if isinstance(v, str):
            if len(v) >= MIN_SECRET and v.lower() not in NOT_SECRET:
                found.append(v)
        elif isinstance(v, dict):
            for item in v.values():
                visit(item)
        elif isinstance(v, (list, tuple)):
            for item in v:
                visit(item)
        elif v is not None:
            for attr in ("token", "refresh_token", "_refresh_token", "client_secret"):
                visit(getattr(v, attr, None))

    visit(value)
    return tuple(sorted(set(found), key=len, reverse=True))


def _forms(secrets: Iterable[str]) -> list[str]:
    forms = set()
    for s in secrets:
        forms |= {s, quote(s, safe=""), quote_plus(s), repr(s)[1:-1]}
    return sorted(forms, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (raw, URL-encoded or repr-escaped) replaced by ``***``."""
    for form in _forms(secrets):
        if form:
            text = text.replace(form, MASK)
    return text


def chain_text(exc: BaseException) -> str:
    """Everything an exception can show: its traceback with the whole cause/context chain and
    the reprs of its arguments."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text += repr(cur) + repr(cur.args)
        cur = cur.__cause__ or cur.__context__
    return text


def leaks(exc: BaseException, secrets: Iterable[str]) -> bool:
    """True if any secret shows anywhere in ``exc`` or its chain."""
    text = chain_text(exc)
    return any(form and form in text for form in _forms(secrets))


def stand_in(exc: BaseException, secrets: Iterable[str]) -> RedactedError:
    """A :class:`RedactedError` for ``exc`` (its first line of text, secrets masked)."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return RedactedError(f"{type(exc).__name__}: {redact(first[:300], secrets)}")
