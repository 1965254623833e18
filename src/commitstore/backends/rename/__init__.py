"""The rename family: storage where a rename in the destination's folder is the commit point.

The commit recipe (staging name, write, flush, size checks, read-back, one rename, folder sync,
clean-up on failure) and its guarantees are written once, in ``sink.py``. A new rename-family
backend writes only two things:

1. Its primitives: subclass ``sink.RenameBackend[Folder, Handle]`` (a :class:`Backend` that is
   also an ``ops.RenameOps``) and implement the table in ``ops.py``: ``shown``, ``open_folder`` /
   ``close_folder``, ``create_staging`` (exclusive), ``write``, ``finish`` (flush to stable storage
   and close), ``discard``, ``size_of`` (fresh), ``digest_of`` (past caches), ``rename`` (one
   step, per PutMode, retried per policy, never a copy), ``sync_folder`` (or a note that there is
   none), ``remove_at``, ``staging_folder`` (in place) or ``upload`` (local folder, then upload),
   and ``error`` (its exceptions into ``commitstore.errors``, credentials never in messages),
   plus the read side of :class:`Backend` (``open_read``, ``stat``, ``walk``, ``remove``,
   ``free_space``). A ``CommitPolicy`` says how suspicious the recipe must be of the storage.
2. Its factory: ``factory(url, options) -> Backend``, registered in ``commitstore.backends``;
   option and URL problems raise ConfigurationError before any I/O.

``posix/backend.py`` (local disks; mounted bridges in ``posix/bridge.py``) and ``smb/backend.py``
are the two examples; ``fsspec/backend.py`` does the same over any fsspec filesystem (SFTP,
WebDAV, ...), its one filesystem-specific primitive, the move, chosen per filesystem in
``fsspec/_moves.py``. Each strategy has its folder (``posix/``, ``smb/``, ``fsspec/``), as the
object stores do under ``backends/object/``; what the family shares (the recipe, its primitives,
the move-aside replace, the early fsync) stays here.
"""
