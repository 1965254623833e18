"""A ``begin_folder`` write dropped without ``commit`` or ``abort`` (the object garbage-collected
while its process lives) no longer holds its staging folder: gc, in another process at
``min_age=0``, removes it as a dead write's; a write still referenced keeps it. Storage is read
through the file system."""

from __future__ import annotations

import gc as pygc
from pathlib import Path

from commitstore import open_store
from commitstore.layout import STAGING_PREFIX

from .helpers.gcelsewhere import gc_elsewhere, kept_reasons


def _staging(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if STAGING_PREFIX in p.name]


def test_a_dropped_folder_write_is_left_to_gc(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("keep.bin", b"committed")
    kept = store.begin_folder("run/live")
    rec = kept.write_bytes("a.bin", b"a")
    dropped = store.begin_folder("run/dropped")
    dropped.write_bytes("b.bin", b"b")
    del dropped
    pygc.collect()
    report = gc_elsewhere(root)
    assert any("dropped" in p for p in report["removed"]), report
    assert not any("dropped" in p for p in _staging(root)), _staging(root)
    # the write still referenced keeps its folder and commits
    assert any("live" in p for p in _staging(root)), report
    assert "held by a live writer" in kept_reasons(report)
    kept.commit([rec])
    assert (root / "run" / "live" / "a.bin").read_bytes() == b"a"
    assert (root / "keep.bin").read_bytes() == b"committed"
