"""Two processes replacing one folder artifact on S3 (moto) at once, stepped exactly: the
interleaving the crash machine's two-writers rule found in its soak run (``two_writers`` on
``f/ckpt_4``: the first stopped at ``mid-copy``, the second ran to the end, the first was
resumed).

Writer A stages its whole new version and copies its first file over the final key, then
waits; writer B replaces the folder from start to end (its staged copy, all its copies, its
record; its staged copy deleted); then A copies the rest of its files and writes its record.
The final keys hold B's first file and A's others, no staged copy is left, and neither record
nor pending record describes that: no version of the name verifies. Known, not fixed yet: a
folder replace would have to check, after its copies, that the final keys are still its own
(and copy again if not) before it deletes its staged copy."""

from __future__ import annotations

import time
from typing import Any

import pytest

from commitstore import open_store
from commitstore.testing import S3Backdoor, Target
from commitstore.testing.crashmachine import FOLDER, Writer, folder_files, read_version

from .helpers.s3servers import BUCKET, MotoServer


@pytest.mark.xfail(strict=True, reason="two folder replaces interleaving their copies: a mix")
def test_a_folder_replace_resumed_after_another_completed_leaves_a_version(
    moto: MotoServer,
) -> None:
    prefix = f"tf{time.monotonic_ns()}"
    url, opts = moto.url(prefix), {**moto.options(), "conditional_writes": True}
    t = Target(
        open_store(url, **opts),
        S3Backdoor(moto.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )
    with t.store.stage_dir(FOLDER) as d:
        for rel, body in folder_files(b"old"):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)
    a = Writer(t, FOLDER, b"AAAA", "mid-copy")
    b: Any = None
    try:
        assert a.state == "stopped"
        b = Writer(t, FOLDER, b"BB", "finish")
        assert b.state == "done"
        assert a.resume() == "done"
    finally:
        a.kill()
        if b is not None:
            b.kill()
    fresh = t.reopen()
    assert fresh.verify(FOLDER, level="full").ok, "no version verifies"
    assert read_version(fresh, FOLDER) in (folder_files(b"AAAA"), folder_files(b"BB"))
