"""Artifact names, the store's reserved names, and step inference.

Names are relative, ``/``-separated paths. Every part that starts with ``.commitstore`` is reserved
for the store itself (records live under ``.commitstore/``, staging files and folders are called
``.commitstore.tmp.*``), so no valid artifact name can ever collide with them.
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import urlsplit, urlunsplit

import xxhash

from commitstore.errors import InvalidNameError

RESERVED_PREFIX = ".commitstore"
META_DIR = ".commitstore"
RECORDS_DIR = "records"
STAGING_PREFIX = ".commitstore.tmp."
RECORD_PREFIX = ".commitstore.rec."
RECORD_HASHED_PREFIX = ".commitstore.rech."
RECORD_SUFFIX = ".json"
INTENT_PREFIX = ".commitstore.new."
INTENT_HASHED_PREFIX = ".commitstore.newh."
FOLDERS_DIR = "folders"
"""Below ``.commitstore/``: one marker per multi-writer folder commit in progress on storage
without staging names (object stores), so gc can find what a dead writer uploaded."""
PENDING_DIR = "pending"
"""Below ``.commitstore/``: the pending records of commits in progress on storage whose publish
lock holds nothing (object stores), one per writer (``slot_parts``)."""
OWED_DIR = "owed"
"""Below ``.commitstore/``: the owed journal, copies a mirror is owed (``mirrors/journal.py``)."""
RESUME_DIR = "resume"
"""Below ``.commitstore/``: the state of uploads that a later process may resume (object
stores that resume uploads, ``backends/object/resume.py``), one per artifact name."""
SCRUB_DIR = "scrub"
"""Below ``.commitstore/``: the target's scrub state (``maintenance/scrubstate.py``)."""
STAGED_DIR = "staged"
STAGED_PREFIX = ".commitstore.stg."
STAGED_HASHED_PREFIX = ".commitstore.stgh."
ASIDE_PREFIX = ".commitstore.old."
ASIDE_HASHED_PREFIX = ".commitstore.oldh."
MAX_PART_BYTES = 255

_STEP_RE = re.compile(
    r"(?<![a-z0-9])(?:global_step|step|checkpoint)[=_-]?(\d+)(?![0-9])", re.IGNORECASE
)
"""The frameworks' step patterns: ``step=N`` and ``epoch=E-step=S`` (Lightning), ``step_N``,
``stepN``, ``global_stepN`` (DeepSpeed), ``checkpoint-N`` (Hugging Face). The keyword must not
follow a letter or digit (``mystep3`` has no step), the number is all the digits after it."""

Parts = tuple[str, ...]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""NUL and the other control characters: C0 (below 0x20), DEL and C1 (0x80-0x9f: U+0085 is a
line break to many tools, U+009B a terminal escape)."""


def validate_name(name: object, *, inside_folder: bool = False) -> Parts:
    """Check ``name`` against the naming rules and return its parts.

    ``inside_folder``: ``name`` is the path of a file inside a folder artifact, which the store
    never interprets: it may use the reserved ``.commitstore`` prefix (frameworks write files
    such as ``.commitstore.tmp.cache`` of their own; the folder's record covers them).

    Raises:
        InvalidNameError: with the reason, before any I/O.
    """
    if not inside_folder and type(name) is str and _PLAIN_NAME.fullmatch(name) is not None:
        return tuple(name.split("/"))
    return _validate_general(name, inside_folder)


_PLAIN_PART = r"(?!\.commitstore)(?!\.\.?(?:/|\Z))[A-Za-z0-9_.,=+@~-]{1,255}"
_PLAIN_NAME = re.compile(f"{_PLAIN_PART}(?:/{_PLAIN_PART})*")
"""The usual artifact name, settled by one match: ASCII parts of letters, digits and
``_.,=+@~-`` (one byte a character, so at most :data:`MAX_PART_BYTES` of them), none ``.`` or
``..``, none starting with the reserved prefix. Any other name gets every rule, one by one
(:func:`_validate_general`); both accept the same names."""


def _validate_general(name: object, inside_folder: bool) -> Parts:
    """:func:`validate_name`, rule by rule."""
    if not isinstance(name, str):
        raise InvalidNameError(f"artifact name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidNameError("artifact name is empty")
    if name.startswith("/"):
        raise InvalidNameError(f"artifact name must be relative: {name!r}")
    if "\\" in name:
        raise InvalidNameError(f"artifact name must not contain a backslash: {name!r}")
    if _CONTROL.search(name):
        raise InvalidNameError(
            f"artifact name must not contain NUL or control characters: {name!r}"
        )
    parts = tuple(name.split("/"))
    for part in parts:
        if not part:
            raise InvalidNameError(f"artifact name has an empty part: {name!r}")
        if part in (".", ".."):
            raise InvalidNameError(f"artifact name must not contain '.' or '..' parts: {name!r}")
        if part.isascii():  # one byte a character, nothing to encode
            size = len(part)
        else:
            try:
                size = len(part.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise InvalidNameError(f"artifact name is not valid UTF-8: {name!r}") from exc
        if size > MAX_PART_BYTES:
            raise InvalidNameError(
                f"artifact name part is {size} bytes, more than {MAX_PART_BYTES}: {name!r}"
            )
        if part.startswith(RESERVED_PREFIX) and not inside_folder:
            raise InvalidNameError(
                f"artifact name parts must not start with {RESERVED_PREFIX!r} "
                f"(reserved for records and staging): {name!r}"
            )
    return parts


MAX_STEP = 2**63 - 1
"""Steps are ``0 <= step <= MAX_STEP`` (``docs/format.md``)."""


def infer_step(name: str) -> int | None:
    """The step a framework wrote into ``name``: the number of the last match of one of its
    patterns (:data:`_STEP_RE`): ``step_0810.pt`` -> 810, ``epoch=2-step=300.ckpt`` -> 300,
    ``model-step300-bf16.pt`` -> 300, ``checkpoint-500/`` -> 500. Other numbers are not steps
    (``last.ckpt``, ``ckpt_100.pt``, ``bf16.pt``: None); neither is a number larger than
    :data:`MAX_STEP`. An explicit ``step=`` always wins over this."""
    found = _STEP_RE.findall(name)
    if not found or len(found[-1]) > 64:
        return None
    step = int(found[-1])
    return step if step <= MAX_STEP else None


def staging_part(final_part: str) -> str:
    """A fresh staging name for ``final_part``, unique, hidden from globs, never a valid name."""
    hint = final_part.encode("utf-8")[:64].decode("utf-8", "ignore")
    return f"{STAGING_PREFIX}{secrets.token_hex(8)}.{hint}"


def aside_part(final_part: str) -> str:
    """Where a replace that cannot swap in one step moves the old entry of ``final_part`` while
    the new one moves in (``backends/rename/aside.py``): ``.commitstore.old.<final_part>`` in
    the same folder, or ``.commitstore.oldh.<xxh3_128 hex>`` when that is too long for one
    file name (the same hash as the record's, :func:`record_parts`). Deterministic, so a later
    process finds it; reserved, so never an artifact name."""
    leaf = f"{ASIDE_PREFIX}{final_part}"
    if len(leaf.encode("utf-8")) > MAX_PART_BYTES:
        leaf = f"{ASIDE_HASHED_PREFIX}{xxhash.xxh3_128_hexdigest(final_part.encode())}"
    return leaf


def aside_parts(parts: Parts) -> Parts:
    """:func:`aside_part` of the artifact ``parts``, beside it."""
    return (*parts[:-1], aside_part(parts[-1]))


def is_aside_part(part: str) -> bool:
    """True for names made by :func:`aside_part`."""
    return part.startswith(ASIDE_PREFIX) or part.startswith(ASIDE_HASHED_PREFIX)


def unaside_part(part: str) -> str | None:
    """The name whose aside entry ``part`` is, when the aside spells it out; else None."""
    return part[len(ASIDE_PREFIX) :] if part.startswith(ASIDE_PREFIX) else None


def aside_record_parts(aside: Parts) -> Parts | None:
    """Where the record of the artifact whose aside entry is ``aside`` lives: the artifact's
    own record path when the aside spells the name out, the hashed record path for a hashed
    aside (its name is then only known from inside the record). None for other names."""
    *head, leaf = aside
    if leaf.startswith(ASIDE_HASHED_PREFIX):
        hexpart = leaf[len(ASIDE_HASHED_PREFIX) :]
        return (META_DIR, RECORDS_DIR, *head, f"{RECORD_HASHED_PREFIX}{hexpart}{RECORD_SUFFIX}")
    if leaf.startswith(ASIDE_PREFIX):
        return record_parts((*head, leaf[len(ASIDE_PREFIX) :]))
    return None


def folder_marker_parts(write_id: str) -> Parts:
    """Where the marker of the multi-writer folder commit ``write_id`` lives (object stores):
    ``.commitstore/folders/<write_id>.json``."""
    return (META_DIR, FOLDERS_DIR, f"{write_id}{RECORD_SUFFIX}")


def writer_markers_parts(write_id: str) -> Parts:
    """The folder of the per-writer markers of multi-writer folder commit ``write_id``
    (object stores): ``.commitstore/folders/<write_id>/``."""
    return (META_DIR, FOLDERS_DIR, write_id)


def writer_marker_parts(write_id: str, writer: str) -> Parts:
    """The marker of one writer of folder commit ``write_id``, listing the files it uploads:
    ``.commitstore/folders/<write_id>/<writer>.json``."""
    return (*writer_markers_parts(write_id), f"{writer}{RECORD_SUFFIX}")


def resume_parts(parts: Parts) -> Parts:
    """Where the resumable upload of artifact ``parts`` keeps its state (object stores):
    ``.commitstore/resume/<32 hex>.json``, ``<32 hex>`` the xxh3_128 of the name (the state
    itself carries the name). Deterministic, so any later process finds it."""
    digest = xxhash.xxh3_128_hexdigest("/".join(parts).encode("utf-8"))
    return (META_DIR, RESUME_DIR, f"{digest}{RECORD_SUFFIX}")


def is_staging_part(part: str) -> bool:
    """True for names made by :func:`staging_part`."""
    return part.startswith(STAGING_PREFIX)


def record_parts(parts: Parts) -> Parts:
    """Where the record of artifact ``parts`` lives, relative to the store root.

    ``a/b/c.pt`` -> ``.commitstore/records/a/b/.commitstore.rec.c.pt.json``. A final part too long
    for one file name is stored under its xxh3_128 (``.commitstore.rech.<hex>.json``); the record
    itself carries the full name.
    """
    last = parts[-1]
    leaf = f"{RECORD_PREFIX}{last}{RECORD_SUFFIX}"
    if len(leaf.encode("utf-8")) > MAX_PART_BYTES:
        leaf = f"{RECORD_HASHED_PREFIX}{xxhash.xxh3_128_hexdigest(last.encode())}{RECORD_SUFFIX}"
    return (META_DIR, RECORDS_DIR, *parts[:-1], leaf)


def intent_parts(parts: Parts) -> Parts:
    """Where a commit in progress keeps the record it is about to publish (its intent): beside
    the record, ``.commitstore.new.<last>.json`` (hashed like the record when too long). Written
    before the data is published and removed after the record is; see ``_commit``."""
    *head, leaf = record_parts(parts)
    if leaf.startswith(RECORD_HASHED_PREFIX):
        leaf = INTENT_HASHED_PREFIX + leaf[len(RECORD_HASHED_PREFIX) :]
    else:
        leaf = INTENT_PREFIX + leaf[len(RECORD_PREFIX) :]
    return (*head, leaf)


def slot_dir_parts(parts: Parts) -> Parts:
    """The folder of the writers' pending records of artifact ``parts`` (object stores):
    ``.commitstore/pending/<dir parts>/<intent leaf>/`` (the leaf of :func:`intent_parts`)."""
    *head, leaf = intent_parts(parts)
    return (META_DIR, PENDING_DIR, *head[2:], leaf)


def slot_parts(parts: Parts, writer: str) -> Parts:
    """One writer's pending record of artifact ``parts``: ``<slot dir>/<writer>.json``,
    ``writer`` 16 hex digits."""
    return (*slot_dir_parts(parts), f"{writer}{RECORD_SUFFIX}")


_SLOT_LEAF = re.compile(r"[0-9a-f]{16}\.json")


def is_slot_leaf(part: str) -> bool:
    """True for the file names :func:`slot_parts` produces."""
    return _SLOT_LEAF.fullmatch(part) is not None


def staged_parts(parts: Parts, digest: str) -> Parts:
    """Where an object-store folder replace uploads the new version of folder ``parts`` before
    it touches an old file: ``.commitstore/staged/<dir parts>/.commitstore.stg.<last>.<hex>``,
    ``<hex>`` the 32 hex digits of the new version's folder ``digest`` (so the pending record
    names its staged copy). A final part too long for that is stored under its xxh3_128
    (``.commitstore.stgh.<32 hex>.<hex>``)."""
    *head, last = parts
    hexpart = digest.rpartition(":")[2]
    leaf = f"{STAGED_PREFIX}{last}.{hexpart}"
    if len(leaf.encode("utf-8")) > MAX_PART_BYTES:
        leaf = f"{STAGED_HASHED_PREFIX}{xxhash.xxh3_128_hexdigest(last.encode())}.{hexpart}"
    return (META_DIR, STAGED_DIR, *head, leaf)


def is_staged_leaf(part: str) -> bool:
    """True for the folder names :func:`staged_parts` produces."""
    return part.startswith(STAGED_PREFIX) or part.startswith(STAGED_HASHED_PREFIX)


def is_intent_leaf(part: str) -> bool:
    """True for the file names :func:`intent_parts` produces."""
    return part.endswith(RECORD_SUFFIX) and (
        part.startswith(INTENT_PREFIX) or part.startswith(INTENT_HASHED_PREFIX)
    )


def record_of_intent(rel: Parts) -> Parts:
    """The record path (below the records folder) of an intent path (below it too)."""
    leaf = rel[-1]
    if leaf.startswith(INTENT_HASHED_PREFIX):
        return (*rel[:-1], RECORD_HASHED_PREFIX + leaf[len(INTENT_HASHED_PREFIX) :])
    return (*rel[:-1], RECORD_PREFIX + leaf[len(INTENT_PREFIX) :])


def name_from_record_parts(rel: Parts) -> str | None:
    """Inverse of :func:`record_parts` for paths below ``.commitstore/records``; None if the leaf
    is hashed (the name is then only known from inside the record) or not a record name."""
    leaf = rel[-1]
    if leaf.startswith(RECORD_PREFIX) and leaf.endswith(RECORD_SUFFIX):
        last = leaf[len(RECORD_PREFIX) : -len(RECORD_SUFFIX)]
        return "/".join((*rel[:-1], last))
    return None


def is_record_leaf(part: str) -> bool:
    """True for the file names :func:`record_parts` produces."""
    return part.endswith(RECORD_SUFFIX) and (
        part.startswith(RECORD_PREFIX) or part.startswith(RECORD_HASHED_PREFIX)
    )


def redact_url(url: str) -> str:
    """``url`` without a password (``smb://user:pw@host`` -> ``smb://user@host``)."""
    parts = urlsplit(url)
    if "://" not in url or parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))
