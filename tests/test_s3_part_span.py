"""The S3 part-size rule (``s3/upload.part_span``): the one function the sink's part sizes, a
resume's up-front check of the server's parts and its reuse of them all follow. No server: the
rule is arithmetic, checked against a walk of the parts one by one."""

from __future__ import annotations

import pytest

from commitstore.backends.object.resume import ResumeState
from commitstore.backends.object.s3.upload import MAX_PARTS, S3Upload, part_span

MiB = 1024 * 1024


def test_parts_are_contiguous_and_double_every_thousand() -> None:
    part = 5 * MiB
    offset = 0
    for number in range(1, MAX_PARTS + 1):
        at, size = part_span(number, part)
        assert at == offset, number
        assert size == part << ((number - 1) // 1000), number
        offset += size
    assert part_span(1000, part) == (999 * part, part)
    assert part_span(1001, part) == (1000 * part, 2 * part)
    assert offset == 1000 * part * (2**10 - 1)  # ten sizes of 1,000 parts each


def test_part_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        part_span(0, 5 * MiB)


def test_reuse_moves_the_sink_to_the_next_parts_size() -> None:
    """A reused part leaves :attr:`S3Upload.part_size` at the size of the part after it, as a
    sent one does (the sink fills the next part with it)."""

    class Calls:
        part_size, max_inflight = 5 * MiB, 1

        def key(self, parts: tuple[str, ...]) -> str:
            return "/".join(parts)

    up = S3Upload(Calls(), ("a",), create_only=False)  # type: ignore[arg-type]
    md5 = bytes(16)
    up._held = {n: (md5.hex(), 5 * MiB) for n in range(1, 1001)}
    up._state = ResumeState("a", "a", "id", 5 * MiB, {})
    for number in range(1, 1001):
        assert up.reuse(number, md5, 5 * MiB) is not None
        assert up.part_size == (5 * MiB if number < 1000 else 10 * MiB), number
