"""SMB shares (``smb://``, ``smb-checked``): ``backend`` holds the strategy and its factory,
``_conn`` the connections, error translation, retries and the translating reader."""

from commitstore.backends.rename.smb.backend import SmbBackend, factory

__all__ = ["SmbBackend", "factory"]
