"""Any fsspec filesystem with a move (SFTP, WebDAV, ...: ``fsspec-checked``): ``backend`` holds
the strategy, ``urls`` its factories per scheme, ``_moves`` the per-filesystem move, flush, free
space and error translation."""

from commitstore.backends.rename.fsspec.backend import FsspecBackend

__all__ = ["FsspecBackend"]
