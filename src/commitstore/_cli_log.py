"""What the command line prints on stderr: log lines that name their target, one-line errors,
and the JSON forms of both under ``--json``.

Levels: ``-q`` errors only; by default warnings (which include every deletion: prune and gc
summaries); ``-v`` also each commit, copy and deletion; ``-vv`` debug, and the warnings and
tracebacks of third-party libraries (gcsfs, aiohttp, botocore...), which are otherwise
silenced so that an error is the one line commitstore prints about it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

OUR_LOGGER = "commitstore"

TARGETS: list[str] = []
"""The URLs the running command opened (primary first): a log line of commitstore's that names
none of them is prefixed with the primary's."""


def level_of(verbosity: int) -> int:
    """The commitstore logger's level for ``-v`` count minus ``-q`` count."""
    if verbosity < 0:
        return logging.ERROR
    return (logging.WARNING, logging.INFO)[verbosity] if verbosity < 2 else logging.DEBUG


def _ours(record: logging.LogRecord) -> bool:
    return record.name == OUR_LOGGER or record.name.startswith(OUR_LOGGER + ".")


def with_target(record: logging.LogRecord) -> str:
    """The record's message, prefixed with the primary's URL when it names no target."""
    msg = record.getMessage()
    if _ours(record) and TARGETS and not any(t in msg for t in TARGETS):
        return f"{TARGETS[0]}: {msg}"
    return msg


class TextFormatter(logging.Formatter):
    """``commitstore: warning: URL: message``; a traceback only when ``tracebacks``."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        who = "commitstore" if _ours(record) else record.name
        text = f"{who}: {record.levelname.lower()}: {with_target(record)}"
        if self.tracebacks and record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class JsonFormatter(logging.Formatter):
    """``{"log": {"level", "message"}}`` (a third-party line also says its ``logger``)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "level": record.levelname.lower(),
            "message": with_target(record),
        }
        if not _ours(record):
            doc["logger"] = record.name
        return json.dumps({"log": doc}, ensure_ascii=False)


class _Filter(logging.Filter):
    def __init__(self, third_party: bool) -> None:
        super().__init__()
        self.third_party = third_party

    def filter(self, record: logging.LogRecord) -> bool:
        return _ours(record) or (self.third_party and record.levelno >= logging.WARNING)


@contextlib.contextmanager
def logging_for(verbosity: int, as_json: bool) -> Iterator[None]:
    """For the run of one command: commitstore's log at the level of ``verbosity`` on stderr,
    third-party loggers and Python warnings only at ``-vv`` (commitstore logs each warning it
    issues, so nothing of ours is lost). Everything is put back afterwards."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter(verbosity >= 2))
    handler.addFilter(_Filter(verbosity >= 2))
    root, ours = logging.getLogger(), logging.getLogger(OUR_LOGGER)
    old_level = ours.level
    root.addHandler(handler)
    ours.setLevel(level_of(verbosity))
    try:
        with warnings.catch_warnings():
            if verbosity < 2:
                warnings.simplefilter("ignore")
            yield
    finally:
        root.removeHandler(handler)
        ours.setLevel(old_level)
        TARGETS.clear()


def stderr_json(doc: Any) -> None:
    print(json.dumps(doc, ensure_ascii=False), file=sys.stderr, flush=True)


def message_of(exc: BaseException) -> str:
    """One line for ``exc``: its own message; an ``OSError`` from outside commitstore (a local
    file of the command line) as ``PATH: no such file`` rather than ``[Errno 2] ...``."""
    from commitstore.errors import CommitStoreError

    if isinstance(exc, OSError) and not isinstance(exc, CommitStoreError) and exc.errno:
        what = {errno.ENOENT: "no such file"}.get(exc.errno) or os.strerror(exc.errno).lower()
        return f"{exc.filename}: {what}" if exc.filename is not None else what
    return str(exc) or type(exc).__name__


def error_doc(kind: str, message: str, code: int, exc: BaseException | None = None) -> Any:
    """``{"error": {...}}``: the error's type and message, the exit status, ``"usage": true``
    for a usage error (exit status 2), and its ``errno`` and integrity ``status`` where it has
    them."""
    doc: dict[str, Any] = {"type": kind, "message": message, "exit_code": code}
    if code == 2:  # a usage error, whatever raised it: argparse, or a bad name or option
        doc["usage"] = True
    if isinstance(exc, OSError) and exc.errno is not None:
        doc["errno"] = errno.errorcode.get(exc.errno, exc.errno)
    status = getattr(exc, "status", None)
    if isinstance(status, str):
        doc["status"] = status
    return {"error": doc}


def exit_code_of(exc: BaseException) -> int | None:
    """The exit status for an expected error (None: not one, a bug to show in full): 1 for a
    storage state (even one that is also a name error), an integrity problem or any failed
    operation; 2 for a bad name, option or argument."""
    from commitstore.errors import (
        CommitStoreError,
        ConfigurationError,
        InvalidNameError,
        StorageError,
    )

    if isinstance(exc, StorageError):
        return 1
    if isinstance(exc, InvalidNameError | ConfigurationError):
        return 2
    if isinstance(exc, CommitStoreError | OSError):
        return 1
    return None


def fail(as_json: bool, exc: BaseException, code: int) -> int:
    """Print ``exc`` as the command's error (one line: text, or a JSON object) and return
    ``code``."""
    return fail_as(as_json, exc, message_of(exc), code)


def fail_as(as_json: bool, exc: BaseException, message: str, code: int) -> int:
    """:func:`fail`, saying ``message`` (one line) with the type, ``errno`` and ``status`` of
    ``exc``: the one error line of a command that failed without raising (``rm`` of a name
    that is not committed, ``verify`` that found a problem...), whose result went to stdout."""
    message = " ".join(message.split("\n"))
    if as_json:
        stderr_json(error_doc(type(exc).__name__, message, code, exc))
    else:
        print(f"commitstore: error: {message}", file=sys.stderr)
    return code


SHOWN = 5
"""How many problems the one error line of a summary names (the rest are counted)."""


def summary(what: str, problems: list[str]) -> str:
    """``what: p1; p2; ... and N more``, at most :data:`SHOWN` named."""
    more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return f"{what}: {'; '.join(problems[:SHOWN])}{more}"
