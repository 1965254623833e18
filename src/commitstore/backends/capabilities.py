"""What a backend declares about itself: :class:`Capabilities`, the one place each guarantee
of its storage and each behaviour the core steers by is stated. The core reads them only
through ``backend.capabilities``, ``describe()`` shows them, and the backend contract
(``commitstore.testing.BackendContract``) holds a backend to each field."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Declared properties of a backend; the conformance suite checks each one is true."""

    atomic_replace: bool
    """Publishing onto an existing name replaces it in one step (readers see old or new)."""
    exclusive_create: bool
    """Publishing with ``PutMode.CREATE`` fails, atomically, if the name exists."""
    dir_fsync: bool
    """Directory entries can be made durable (fsync of the directory)."""
    atomic_dir_publish: bool
    """A folder artifact appears under its name in one step."""
    free_space: bool
    """``free_space`` answers with a number."""
    empty_folders: bool = True
    """An empty folder artifact is visible as a folder (object stores have no folders)."""
    mtime_resolution: float = 0.0
    """Seconds by which a modification time the store reports may lag the write it dates (S3
    and Azure listings, SFTP and WebDAV: whole seconds). gc counts every entry that much
    younger, so a writer whose heartbeat is within ``min_age`` is never judged dead by a
    truncated time."""
    client_retries: bool = False
    """Each request is retried by the store's own client as often as the store allows, each
    attempt bounded by its timeouts (object stores): a mirror copy that timed out there is not
    tried again as a whole (``mirrors/copy``), which would repeat every attempt per copy."""
    staging_names: bool = True
    """Writes in flight leave entries under reserved staging names (``.commitstore.tmp.*``)
    until they publish, as the rename family does: gc, deletes and reads look for them. Not
    declared (object stores, which upload to the final key): none ever appear, and nothing
    looks for them."""
    writer_slots: bool = False
    """:meth:`Backend.publish_lock` holds nothing across processes (object stores): each commit
    then writes its pending record to a slot of its own (``_slots``), which gc, prune and the
    foreign-file check read besides the pending record."""
    plans_from_records: bool = False
    """A prune may plan from the records' listing alone and look at data only where the plan
    depends on it (the newest artifacts, the ones the policy keeps, names with a commit in
    flight): declared where data is only ever changed by a whole replace, which a commit fronts
    with its pending record, and where listing every data file costs per key (object stores).
    Every delete still re-checks its data and record with fresh stats first
    (``prune.still_planned``), so this changes what a plan costs, never what is deleted.
    Elsewhere (file systems, where a modification time can be 0, "unknown") the plan lists the
    data too."""
    read_concurrency: int = 1
    """How many small reads (records) may run at once, each on its own thread, through one
    :meth:`Backend.small_reads` reader (scans, the record cache, prune's re-checks); object
    stores raise it."""
    rereads_locally: bool = False
    """:meth:`Backend.open_read` returns readers whose raw file is :class:`Rereadable` and a
    second read of the same bytes costs no transfer (a local disk's page cache): a copy to a
    sink that takes :meth:`FileSink.reread_from` then holds none of the bytes in memory."""
    reread_bodies: bool = False
    """A file sink takes :meth:`FileSink.reread_from` (of a source offered before its first
    write): it sends its bodies read again from that source instead of buffers it holds, and
    only where the server checks each body against the checksum computed from the bytes
    written (S3's Content-MD5), so a source that changed fails the publish."""
    whole_max: int = 0
    """Bytes a file sink holds in memory (to send them as one whole-object put) before it
    sends in parts: an object store's single-put limit. 0: the sink stages on the storage as
    it is written. With :attr:`reread_bodies` and a rereadable source, nothing is held."""


LEGACY_FLAGS = (
    "staging_names",
    "writer_slots",
    "plans_from_records",
    "read_concurrency",
    "rereads_locally",
)
"""The :class:`Capabilities` fields that backends once declared as loose class attributes;
:meth:`Backend.__init_subclass__` folds such a declaration into the class's capabilities."""
