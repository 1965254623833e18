"""The record codec and layout, and the exact public surface."""

from __future__ import annotations

import json
import types
from datetime import datetime, timezone
from pathlib import Path

import pytest

import commitstore
from commitstore import FileRecord, Record, open_store
from commitstore.digest import manifest_digest
from commitstore.layout import infer_step, record_parts, validate_name
from commitstore.records import RecordFormatError, decode_record, encode_record


def test_roundtrip_is_exact() -> None:
    rec = Record(
        name="a/step_1",
        step=1,
        size=3,
        digest=manifest_digest([("x", 3, "xxh3_128:" + "1" * 32)]),
        files=(FileRecord("x", 3, "xxh3_128:" + "1" * 32),),
        created=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
        metadata={"k": [1, "two", None]},
        kind="dir",
    )
    assert decode_record(encode_record(rec)) == rec
    assert encode_record(decode_record(encode_record(rec))) == encode_record(rec)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("digest"),
        lambda d: d.update(size=-1),
        lambda d: d.update(size="3"),
        lambda d: d.update(step=True),
        lambda d: d.update(digest="md5:abc"),
        lambda d: d.update(kind="link"),
        lambda d: d.update(created="yesterday"),
        lambda d: d.update(files=[{"path": "x"}]),
        lambda d: d.update(schema="commitstore.record/2"),
        lambda d: d.update(metadata=[]),
    ],
)
def test_schema_violations_are_format_errors(mutate: object) -> None:
    rec = Record("n", None, 3, "xxh3_128:" + "a" * 32)
    doc = json.loads(encode_record(rec))
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(RecordFormatError):
        decode_record(json.dumps(doc).encode())


def test_garbage_is_format_error() -> None:
    for raw in (b"", b"\xff\xfe", b"[]", b"null", b'{"schema": 1}'):
        with pytest.raises(RecordFormatError):
            decode_record(raw)


def test_step_inference() -> None:
    assert infer_step("step_0810.pt") == 810
    assert infer_step("run3/ckpt-12/model.v2") is None  # numbers that are not steps
    assert infer_step("final.pt") is None


def test_record_stored_elsewhere_is_bad(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.put_bytes("a_1", b"a")
    store.put_bytes("b_2", b"b")
    rec_a = tmp_path / ".commitstore/records/.commitstore.rec.a_1.json"
    rec_b = tmp_path / ".commitstore/records/.commitstore.rec.b_2.json"
    rec_b.write_bytes(rec_a.read_bytes())
    statuses = {r.name: r.status for r in store.verify().results}
    assert statuses == {"a_1": "ok", "b_2": "bad_record"}
    assert [r.name for r in store.list()] == ["a_1"]
    with pytest.raises(commitstore.IntegrityError):
        store.record("b_2")


def test_long_final_part_uses_hashed_record_name(tmp_path: Path) -> None:
    name = "x" * 255
    parts = validate_name(name)
    assert record_parts(parts)[-1].startswith(".commitstore.rech.")
    store = open_store(tmp_path)
    store.put_bytes(name, b"long")
    assert [r.name for r in store.list()] == [name]
    assert store.verify().ok


def test_exports_are_exact() -> None:
    public = {
        n
        for n, v in vars(commitstore).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType) and n != "annotations"
    }
    assert public == set(commitstore.__all__) - {"__version__"}
    for name in commitstore.__all__:
        assert hasattr(commitstore, name)
