"""gc of the state resumable uploads keep (``.commitstore/resume/``, ``backends/object/resume``).

A state is removed once older than ``min_age`` (it is rewritten as its upload's parts land),
unless the upload it names is still live (gc kept it: its writer's proof of life, or a part,
is younger than ``min_age``). Its upload, when older, is aborted by gc's pass over the
unfinished uploads, which runs first (a GCS session, which no listing shows, is cancelled
with its state: ``Backend.abandon_upload_of``). A state that does not parse is aged the same
way. A later
attempt whose state gc removed starts a new upload."""

from __future__ import annotations

from collections.abc import Callable

from commitstore.backends import Backend
from commitstore.errors import NotFoundError
from commitstore.layout import META_DIR, RESUME_DIR
from commitstore.records import RecordFormatError


def collect(
    backend: Backend,
    judge: Callable[[str, str, float | None], bool],
    live: set[str],
    *,
    dry_run: bool,
) -> list[tuple[str, str]]:
    """Remove the resume states ``judge`` finds old enough whose upload id is not in ``live``
    (the ids of the unfinished uploads gc kept). Returns the (path, reason) of the states kept
    because their upload is live."""
    kept: list[tuple[str, str]] = []
    for rel, info in backend.walk((META_DIR, RESUME_DIR)):
        parts = (META_DIR, RESUME_DIR, *rel)
        path = "/".join(parts)
        try:
            data = backend.read_small(parts)
        except NotFoundError:
            continue  # completed or dropped by its writer meanwhile
        except RecordFormatError:
            data = b""
        found = backend.resume_upload_of(data)
        if found is not None and found[1] in live:
            kept.append((path, "its upload is live"))
            continue
        if judge(path, "resume", info.mtime) and not dry_run:
            backend.abandon_upload_of(data)  # GCS: its session, which no listing shows
            backend.remove(parts)
    return kept
