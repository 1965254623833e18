"""What the crash machine's killed and resumed ``put_file`` uploads need to know of a backend:
the size of the source it sends, whether it resumes, where a GCS writer is stopped, and the
bytes a resumed GCS upload sends (counted by the requests it makes)."""

from __future__ import annotations

from typing import Any

from commitstore import CommitStore
from commitstore.testing.backdoor import S3Backdoor
from commitstore.testing.target import Target

__all__ = [
    "MiB",
    "count_chunk_bytes",
    "gcs_changed_at",
    "gcs_fresh",
    "gcs_kill_point",
    "resumes",
    "source_size",
    "wait_dead_uploads",
]

MiB = 1024 * 1024


def source_size(backend: Any) -> int:
    """The size of the source rule ``killed_put_file`` sends: three parts (the last one MiB) on
    a store that sends a file of that size in parts; on GCS, its first and last MiB (the
    source's identity hashes them) with four and a half chunks between; else 2 MiB."""
    if getattr(backend, "resumes_uploads", False):
        return 2 * MiB + 4 * int(backend.chunk_size) + int(backend.chunk_size) // 2
    part = getattr(backend, "part_size", None)
    if not isinstance(part, int):
        return 2 * MiB
    return 2 * part + MiB


def wait_dead_uploads(t: Target, name: str) -> None:
    """On S3: wait until the unfinished uploads of ``name`` (a killed writer's) look dead to a
    resuming writer, which never joins a live one (``s3/upload.STALE_BEATS`` heartbeats of
    the store plus its mtime resolution, by the backdoor's reading of the server's times).
    Elsewhere: nothing."""
    door = t.door
    if not isinstance(door, S3Backdoor):
        return
    from commitstore.backends.object.s3.upload import STALE_BEATS

    backend: Any = t.store._committer.backend
    limit = STALE_BEATS * float(backend.heartbeat) + float(backend.mtime_resolution)
    door.wait_dead(f"{door.prefix}/{name}" if door.prefix else name, limit)


def resumes(backend: Any, size: int) -> bool:
    """A ``put_file`` of ``size`` bytes on ``backend`` is sent in parts a later attempt may
    resume (S3: ``reread_bodies``, GCS: ``resumes_uploads``; above ``whole_max``)."""
    return bool(
        getattr(backend, "reread_bodies", False) or getattr(backend, "resumes_uploads", False)
    ) and size > int(backend.whole_max)


def gcs_kill_point(seed: int, chunk: int) -> str:
    """Where rule ``killed_put_file`` stops a GCS writer of chunks of ``chunk`` bytes, drawn
    from its ``seed``: once the resume state says the chunks up to the first or second past
    the source's first MiB (:func:`gcs_changed_at` is in the first of them) were acknowledged
    (none in flight), or (one seed in three) right after the answer to that chunk came, the
    state still listing it in flight (fake-gcs-server cannot be asked what it holds: a resume
    starts over)."""
    n = MiB // chunk + 1 + seed % 2
    return f"gcs-in-flight:{n}" if (seed // 2) % 3 == 0 else f"gcs-acked:{n}"


def count_chunk_bytes(store: CommitStore) -> list[int]:
    """On a GCS store: count the bytes its chunk requests send (a resumed upload's, by the
    request it makes, not by what it says it reused) in the list returned, from now on."""
    backend: Any = store._committer.backend
    sent = [0]
    if not getattr(backend, "resumes_uploads", False):
        return sent
    call = backend.call

    def calling(what: str, parts: Any, method: str, path: str, *a: Any, **kw: Any) -> Any:
        headers = kw.get("headers") or {}
        if method == "POST" and str(headers.get("Content-Range", "")).startswith("bytes "):
            sent[0] += int(headers.get("Content-Length", 0))
        return call(what, parts, method, path, *a, **kw)

    backend.call = calling
    return sent


def gcs_changed_at(chunk: int) -> int:
    """Where rule ``killed_put_file`` rewrites a GCS source (``change``): in the middle of the
    first chunk past its first MiB (outside the MiB its identity hashes at either end)."""
    return MiB + chunk // 2


def gcs_fresh(seed: int) -> bool:
    """Whether rule ``killed_put_file`` on GCS sends its source to a name with nothing
    committed (deleted first: the state's word is resumed on fake-gcs-server only when no
    object stands under the name) rather than over an old version (which starts over)."""
    return (seed // 6) % 3 != 0
