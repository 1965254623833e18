"""The scan's shortcuts decide exactly as the general rules: a record in the encoder's layout
(``records._decode_canonical``) and a plain artifact name (``layout._PLAIN_NAME``) are settled by
one pattern match; anything the shortcut does not accept goes through every rule one by one. Each
test checks, over a corpus that includes the hostile records of ``test_hostile`` and seeded
single-character edits of valid records, that the shortcut never accepts what the general path
rejects and always gives the same result when it accepts; and that it is taken for what commits
write (else it would be a dead branch)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from commitstore import FileRecord, Record, open_store
from commitstore._scan import scan_entries
from commitstore.digest import manifest_digest
from commitstore.layout import (
    META_DIR,
    RECORDS_DIR,
    _validate_general,
    aside_part,
    record_parts,
    validate_name,
)
from commitstore.records import (
    MAX_RECORD_BYTES,
    RecordFormatError,
    _decode_canonical,
    _decode_json,
    decode_record,
    encode_record,
)
from tests.test_hostile import HOSTILE

DIGEST = "xxh3_128:" + "0123456789abcdef" * 2
WHEN = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=timezone.utc)

VALID = [
    Record("ckpt/step_000123.pt", 123, 64, DIGEST, created=WHEN),
    Record("final.pt", None, 0, DIGEST, created=WHEN),
    Record("last.ckpt", 7, 2**63 - 1, DIGEST, created=WHEN, alias=True),
    Record("a b/é ✓/x.pt", 0, 5, DIGEST, created=WHEN, metadata={"k": [1, "two", None, 2.5]}),
    Record("m.pt", 3, 3, DIGEST, created=WHEN, metadata={"n": {"d": {"e": [[], {}]}}, "s": "}"}),
    Record("t.pt", 1, 1, DIGEST, created=WHEN, metadata={"name": '", "name": "x'}),
]


def _general(raw: bytes) -> Record | str:
    """What the general decoder makes of ``raw``: the record, or the error's text."""
    if len(raw) > MAX_RECORD_BYTES:
        return "error: too large"
    try:
        return _decode_json(raw.decode("utf-8"))
    except Exception as exc:  # the general decoder's own errors, and what decode_record wraps
        return f"error: {type(exc).__name__}: {exc}"


def _agrees(raw: bytes) -> bool:
    """The shortcut's answer for ``raw`` (None: not taken) matches the general decoder's, and so
    does ``decode_record``'s. Returns whether the shortcut was taken."""
    general = _general(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    fast = None if text is None else _decode_canonical(text)
    if fast is not None:
        assert isinstance(general, Record), (raw[:200], general)
        assert fast == general
    try:
        full: Record | str = decode_record(raw)
    except RecordFormatError as exc:
        full = f"error: {exc}"
    if isinstance(general, Record):
        assert full == general
    else:
        assert isinstance(full, str)
    return fast is not None


@pytest.mark.parametrize("record", VALID, ids=lambda r: r.name)
def test_what_the_encoder_writes_takes_the_shortcut_to_an_equal_record(record: Record) -> None:
    raw = encode_record(record)
    assert _agrees(raw)
    assert _decode_canonical(raw.decode()) == record


def test_folder_records_and_other_layouts_take_the_general_path() -> None:
    files = (FileRecord("f", 3, DIGEST),)
    digest = manifest_digest((f.path, f.size, f.digest) for f in files)
    folder = Record("d", 1, 3, digest, files=files, kind="dir", created=WHEN)
    doc = json.loads(encode_record(VALID[0]))
    others = [
        json.dumps(dict(reversed(doc.items()))).encode(),  # keys in another order
        json.dumps(doc, sort_keys=True, indent=1).encode(),
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(),
        json.dumps(doc, sort_keys=True).replace('"name": "', '"name": "\\u0063').encode(),
        json.dumps(doc, sort_keys=True).encode() + b" \n",
    ]
    for raw in others:
        assert not _agrees(raw)
        assert isinstance(_general(raw), Record)
    assert not _agrees(encode_record(folder))
    assert decode_record(encode_record(folder)) == folder


@pytest.mark.parametrize("make", HOSTILE)
def test_hostile_records_are_refused_as_by_the_general_path(
    make: Callable[[dict[str, Any]], bytes],
) -> None:
    doc = json.loads(encode_record(Record("victim", 2, 4, DIGEST, metadata={"m": 1})))
    raw = make(doc)
    taken = _agrees(raw)
    general = _general(raw)
    # the only valid records among them name another artifact (bad where they are stored)
    assert not isinstance(general, Record) or general.name in ("other", "good")
    assert taken == isinstance(general, Record)


def test_seeded_edits_of_valid_records_agree() -> None:
    rng = random.Random(15)
    alphabet = '0123456789abcdef{}[]",:. \\\n-eE+nulltrue\x00\x7fé/'
    taken = 0
    for record in VALID:
        raw = encode_record(record).decode()
        for _ in range(400):
            i = rng.randrange(len(raw))
            op = rng.randrange(3)
            c = rng.choice(alphabet)
            edited = (
                raw[:i] + c + raw[i + 1 :]
                if op == 0
                else raw[:i] + c + raw[i:]
                if op == 1
                else raw[:i] + raw[i + 1 :]
            )
            taken += _agrees(edited.encode())
    assert taken > 0  # some edits (inside the name, a digit, the metadata) stay valid


NAMES = [
    "a",
    "ckpt/step_1.pt",
    "epoch=2-step=300.ckpt",
    "x" * 255,
    "x" * 256,
    "a/" + "y" * 255,
    ".",
    "..",
    "a/./b",
    "a/../b",
    "..a",
    ".a",
    "a..",
    "./a",
    ".commitstore",
    ".commitstorex",
    "a/.commitstore.tmp.1",
    ".Commitstore",
    "a//b",
    "/a",
    "a/",
    "",
    "a b",
    "é",
    "a\\b",
    "a\x00b",
    "a\x7fb",
    "a\nb",
    "\ud800",
]


def _name_answer(fn: Callable[..., object], *args: object) -> object:
    try:
        return fn(*args)
    except Exception as exc:
        return (type(exc), str(exc))


def test_plain_names_are_settled_as_by_every_rule() -> None:
    rng = random.Random(15)
    pieces = ["a", "Z", "9", ".", "..", "/", "_", "-", "=", ".commitstore", " ", "é", "\\", "\x01"]
    corpus: list[object] = [
        *NAMES,
        *("".join(rng.choices(pieces, k=rng.randrange(1, 8))) for _ in range(3000)),
        None,
        7,
        b"a",
    ]
    for name in corpus:
        assert _name_answer(validate_name, name) == _name_answer(_validate_general, name, False)


def test_a_record_read_from_its_aside_entry_has_unknown_age(tmp_path: Path) -> None:
    """A record found only under its aside name (a stopped replace) is listed without the
    record's own entry, so prune never deletes it (its age is unknown)."""
    store = open_store(tmp_path / "s")
    for i in range(3):
        store.put_bytes(f"a/step_{i}.pt", b"x", step=i)
    rec = tmp_path / "s" / Path(*record_parts(("a", "step_0.pt")))
    os.rename(rec, rec.with_name(aside_part(rec.name)))
    found, bad = scan_entries(store._backend)
    infos = {e.record.name: e.info for e in found}
    assert not bad and infos["a/step_0.pt"] is None
    assert infos["a/step_1.pt"] is not None and infos["a/step_1.pt"].size > 0
    report = store.prune(keep_last=1, min_age=0, dry_run=True)
    assert report.deleted == ("a/step_1.pt",)
    assert report.skipped == {"a/step_0.pt": "unknown mtime"}
    assert (tmp_path / "s" / META_DIR / RECORDS_DIR).is_dir()
