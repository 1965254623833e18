"""The conformance suite every backend must pass.

Subclass :class:`StoreConformance` and provide a ``target`` fixture returning a :class:`Target`.
Every assertion reads the storage through the target's backdoor, never through the store under
test (except where the API's own answer is what is being checked).
"""

from __future__ import annotations

import json
import logging
import re
import threading

import pytest

from commitstore import (
    AlreadyExistsError,
    CommitError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.testing._faults import FaultConformance
from commitstore.testing._folders import FolderConformance
from commitstore.testing.target import Target, record_path, staging_files, xxh

STRATEGIES = frozenset(
    {
        "local-rename",
        "bridge-checked",
        "smb-checked",
        "s3-multipart",
        "gcs-resumable",
        "azure-blocklist",
        "memory-swap",
        "fsspec-checked",
    }
)
"""The built-in commit strategies (``backends/__init__.py``); a plugin's may be any other."""


class StoreConformance(FolderConformance, FaultConformance):
    """Behaviour every backend shares. Subclasses override the ``target`` fixture."""

    @pytest.fixture
    def target(self) -> Target:
        raise NotImplementedError("subclasses provide a target fixture")

    # -- commit --------------------------------------------------------------------------
    def test_put_bytes_lands_whole_with_record(self, target: Target) -> None:
        data = b"checkpoint-bytes" * 1000
        rec = target.store.put_bytes("run/step_0810.pt", data, metadata={"loss": 0.5})
        assert target.door.read("run/step_0810.pt") == data
        raw = target.door.read(record_path("run/step_0810.pt"))
        assert raw is not None
        doc = json.loads(raw)
        assert doc["schema"] == "commitstore.record/1"
        assert doc["size"] == len(data) == rec.size
        assert doc["digest"] == xxh(data) == rec.digest
        assert doc["step"] == 810 == rec.step
        assert doc["metadata"] == {"loss": 0.5}
        assert staging_files(target.door) == []

    def test_nothing_under_final_name_until_commit(self, target: Target) -> None:
        st = target.store.stage("step_1.bin")
        st.write(b"a" * 5_000_000)
        assert target.door.read("step_1.bin") is None
        assert target.door.read(record_path("step_1.bin")) is None
        rec = st.commit()
        assert target.door.read("step_1.bin") == b"a" * 5_000_000
        assert rec.digest == xxh(b"a" * 5_000_000)
        assert st.record == rec

    def test_exception_inside_stage_publishes_nothing(self, target: Target) -> None:
        before = target.door.files()
        with pytest.raises(RuntimeError), target.store.stage("step_2.bin") as st:
            st.write(b"x" * 6_000_000)
            raise RuntimeError("killed mid-save")
        assert target.door.files() == before
        assert target.door.read("step_2.bin") is None

    def test_abort_and_close_publish_nothing(self, target: Target) -> None:
        before = target.door.files()
        st = target.store.stage("a_1")
        st.write(b"1")
        st.abort()
        st2 = target.store.stage("a_2")
        st2.write(b"2")
        st2.close()
        assert target.door.files() == before
        with pytest.raises(ValueError, match="aborted"):
            st.write(b"more")

    def test_overwrite_false_keeps_existing(self, target: Target) -> None:
        target.store.put_bytes("w_1", b"first")
        with pytest.raises(AlreadyExistsError):
            target.store.put_bytes("w_1", b"second")
        assert isinstance(AlreadyExistsError("x"), FileExistsError)
        assert target.door.read("w_1") == b"first"
        assert json.loads(target.door.read(record_path("w_1")) or b"")["digest"] == xxh(b"first")
        assert staging_files(target.door) == []

    def test_overwrite_true_replaces_data_and_record(self, target: Target) -> None:
        target.store.put_bytes("w_2", b"first")
        rec = target.store.put_bytes("w_2", b"second!", overwrite=True)
        assert target.door.read("w_2") == b"second!"
        assert json.loads(target.door.read(record_path("w_2")) or b"")["digest"] == xxh(b"second!")
        assert rec.size == 7

    def test_racing_writers_one_wins(self, target: Target) -> None:
        """Two writers of one new name, both staged before either commits. Where create-only
        is declared (``exclusive_create``, or the core's check under the publish lock) exactly
        one wins; everywhere the name ends up whole: bytes and record of one writer that was
        told it won, never a mix, and a writer told it lost published nothing."""
        outcomes: dict[int, str] = {}
        staged: list[int] = []
        barrier = threading.Barrier(2)
        payloads = {0: b"A" * 3_000_000, 1: b"B" * 3_000_000}

        def writer(i: int) -> None:
            store = target.reopen()
            st = store.stage("race_1.bin")
            st.write(payloads[i])
            staged.append(i)
            barrier.wait(60)
            outcomes[i] = "overlapped" if len(staged) == 2 else "alone"
            try:
                st.commit()
                outcomes[i] = "won"
            except AlreadyExistsError:
                outcomes[i] = "lost"
            except CommitError:
                outcomes[i] = "conflict"  # a detected race, where create-only is best effort

        threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(outcomes) == {0, 1} and "alone" not in outcomes.values(), outcomes
        data = target.door.read("race_1.bin")
        assert data in payloads.values()  # never a torn or partial object
        winner = next(i for i, p in payloads.items() if p == data)
        assert outcomes[winner] == "won", outcomes  # the bytes that stand are a winner's
        doc = json.loads(target.door.read(record_path("race_1.bin")) or b"")
        assert doc["digest"] == xxh(payloads[winner])  # and so is the record
        assert target.reopen().verify("race_1.bin").ok
        assert staging_files(target.door) == []
        if target.store._backend.capabilities.exclusive_create:
            assert sorted(outcomes.values()) == ["lost", "won"], outcomes

    # -- names ---------------------------------------------------------------------------
    @pytest.mark.parametrize(
        "bad",
        [
            "",
            "/abs",
            "a//b",
            "a/./b",
            "../escape",
            "a/..",
            "back\\slash",
            "nul\x00byte",
            "ctl\x07",
            "x" * 256,
            ".commitstore/records/x",
            "dir/.commitstore.tmp.abc",
            "a/",
        ],
    )
    def test_invalid_names_rejected_before_io(self, target: Target, bad: str) -> None:
        before = target.door.files()
        with pytest.raises(InvalidNameError):
            target.store.put_bytes(bad, b"data")
        with pytest.raises(InvalidNameError):
            target.store.stage(bad)
        with pytest.raises(ValueError):  # InvalidNameError is also a ValueError
            target.store.read_bytes(bad)
        assert target.door.files() == before

    def test_long_name_parts_up_to_255_bytes(self, target: Target) -> None:
        name = "d/" + "é" * 127  # 254 bytes
        target.store.put_bytes(name, b"long")
        assert target.door.read(name) == b"long"
        assert target.store.record(name).size == 4
        assert target.store.verify().ok

    # -- reading and checking ----------------------------------------------------------
    def test_list_orders_by_step_and_ignores_uncommitted(self, target: Target) -> None:
        for step in (30, 5, 100):
            target.store.put_bytes(f"ckpt/step_{step:04d}.pt", b"s" * step)
        target.door.write("ckpt/step_0200.pt", b"foreign, no record")
        open_stage = target.store.stage("ckpt/step_0300.pt")
        open_stage.write(b"in flight")
        names = [r.name for r in target.store.list()]
        assert names == ["ckpt/step_0005.pt", "ckpt/step_0030.pt", "ckpt/step_0100.pt"]
        open_stage.abort()

    def test_verify_reports_each_status(self, target: Target) -> None:
        s = target.store
        s.put_bytes("good_1", b"g" * 100)
        s.put_bytes("trunc_2", b"t" * 100)
        s.put_bytes("flip_3", b"f" * 100)
        s.put_bytes("gone_4", b"x" * 100)
        s.put_bytes("badjson_5", b"b" * 100)
        s.put_bytes("schema_6", b"c" * 100)
        target.door.write("trunc_2", b"t" * 60)
        target.door.write("flip_3", b"f" * 50 + b"F" + b"f" * 49)
        target.door.remove("gone_4")
        target.door.write(record_path("badjson_5"), b"{not json")
        target.door.write(record_path("schema_6"), json.dumps({"schema": "other/9"}).encode())
        target.door.write("stray.bin", b"no record here")
        full = {r.name: r.status for r in s.verify().results}
        assert full == {
            "good_1": "ok",
            "trunc_2": "size_mismatch",
            "flip_3": "hash_mismatch",
            "gone_4": "missing",
            "badjson_5": "bad_record",
            "schema_6": "bad_record",
            "stray.bin": "no_record",
        }
        size = {r.name: r.status for r in s.verify(level="size").results}
        assert size["trunc_2"] == "size_mismatch" and size["flip_3"] == "ok"
        assert not s.verify().ok
        assert s.verify("good_1").ok and s.verify("stray.bin").results[0].status == "no_record"
        assert s.verify("stray.bin").ok
        assert s.verify("never").results[0].status == "missing"

    def test_latest_skips_bad_with_warning(
        self, target: Target, caplog: pytest.LogCaptureFixture
    ) -> None:
        s = target.store
        for step in (1, 2, 3):
            s.put_bytes(f"step_{step}", bytes([step]) * 1000)
        target.door.write("step_3", b"\x03" * 999 + b"\x00")
        with caplog.at_level(logging.WARNING, logger="commitstore"):
            latest = s.latest()
        assert latest is not None and latest.name == "step_2"
        assert "step_3" in caplog.text and "hash_mismatch" in caplog.text
        size_latest = s.latest(level="size")
        assert size_latest is not None and size_latest.name == "step_3"
        target.door.write("step_2", b"\x02" * 10)
        latest = s.latest(level="size")
        assert latest is not None and latest.name == "step_3"
        assert [r.name for r in s.list()] == ["step_1", "step_2", "step_3"]

    def test_latest_none_when_nothing_whole(self, target: Target) -> None:
        assert target.store.latest() is None
        target.store.put_bytes("only_1", b"abc")
        target.door.write("only_1", b"abd")
        assert target.store.latest() is None

    def test_reads_refuse_bad_bytes(
        self, target: Target, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        s = target.store
        s.put_bytes("r_1", b"0123456789" * 100)
        with s.open("r_1") as f:
            assert f.read() == b"0123456789" * 100
            f.seek(10)
            assert f.read(5) == b"01234"
        target.door.write("r_1", b"0123456789" * 99 + b"012345678X")
        with pytest.raises(IntegrityError) as info:
            s.open("r_1")
        assert info.value.expected_digest == xxh(b"0123456789" * 100)
        with pytest.raises(IntegrityError):
            s.read_bytes("r_1")
        out = tmp_path_factory.mktemp("get") / "r_1.bin"
        with pytest.raises(IntegrityError):
            s.get_file("r_1", out)
        assert not out.exists()
        assert list(out.parent.iterdir()) == []
        assert s.read_bytes("r_1", verify="size")[-1:] == b"X"
        assert s.read_bytes("r_1", verify="none")[-1:] == b"X"
        target.door.write("r_1", b"short")
        with pytest.raises(IntegrityError) as info:
            s.read_bytes("r_1", verify="size")
        assert info.value.status == "size_mismatch"

    def test_get_file_file_and_folder(
        self, target: Target, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        s = target.store
        s.put_bytes("g_1.bin", b"payload" * 1000)
        with s.stage_dir("g_2") as d:
            (d / "a").write_bytes(b"A")
            (d / "b").mkdir()
            (d / "b" / "c").write_bytes(b"C" * 10)
        out = tmp_path_factory.mktemp("get")
        s.get_file("g_1.bin", out / "one.bin")
        assert (out / "one.bin").read_bytes() == b"payload" * 1000
        s.get_file("g_2", out / "folder")
        assert (out / "folder" / "b" / "c").read_bytes() == b"C" * 10
        target.door.write("g_2/b/c", b"C" * 9 + b"D")
        with pytest.raises(IntegrityError):
            s.get_file("g_2", out / "folder2")
        assert not (out / "folder2").exists()
        assert sorted(p.name for p in out.iterdir()) == ["folder", "one.bin"]

    def test_record_and_delete(self, target: Target) -> None:
        s = target.store
        with pytest.raises(NotFoundError):
            s.record("nope")
        s.put_bytes("d_1", b"abc", step=7)
        assert s.record("d_1").step == 7
        s.delete("d_1")
        assert target.door.read("d_1") is None
        assert target.door.read(record_path("d_1")) is None
        with pytest.raises(NotFoundError):
            s.delete("d_1")
        with pytest.raises(FileNotFoundError):
            s.read_bytes("d_1")

    def test_unstepped_names_order_by_commit_time(self, target: Target) -> None:
        s = target.store
        s.put_bytes("config.json", b"{}")
        s.put_bytes("step_3", b"3")
        s.put_bytes("notes.txt", b"n")
        s.put_bytes("step_9", b"9")
        s.put_bytes("final.pt", b"f")
        # Stepped ones by step; unstepped ones where their commit time puts them among those.
        assert [r.name for r in s.list()] == [
            "config.json",
            "step_3",
            "notes.txt",
            "step_9",
            "final.pt",
        ]
        latest = s.latest()
        assert latest is not None and latest.name == "final.pt"

    # -- declared capabilities are true --------------------------------------------------
    def test_describe_names_strategy(self, target: Target) -> None:
        """``describe()`` says which strategy this is, why, where, and exactly the capabilities
        the backend declares (the ones the other tests hold it to)."""
        store = target.store
        info = store.describe()
        assert info["strategy"] == store._backend.strategy
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", info["strategy"]), info["strategy"]
        if type(store._backend).__module__.startswith("commitstore."):
            assert info["strategy"] in STRATEGIES, info["strategy"]
        assert isinstance(info["reason"], str) and len(info["reason"]) > 10
        assert info["url"] == store.url
        caps = store._backend.capabilities
        assert info["capabilities"] == {k: getattr(caps, k) for k in caps.__dataclass_fields__}
        numbers = ("mtime_resolution", "read_concurrency", "whole_max")
        flags = {k: v for k, v in info["capabilities"].items() if k not in numbers}
        assert all(isinstance(v, bool) for v in flags.values()), flags
        resolution = info["capabilities"]["mtime_resolution"]  # seconds: a number, not a flag
        assert isinstance(resolution, float) and 0.0 <= resolution <= 2.0, resolution
        reads, held = info["capabilities"]["read_concurrency"], info["capabilities"]["whole_max"]
        assert type(reads) is int and reads >= 1, reads  # small reads at once
        assert type(held) is int and held >= 0, held  # bytes a file sink holds in memory
        assert info["strategy"] in repr(store)
        json.dumps(info, default=str)  # plain values: the CLI's ``info --json`` prints it
