"""Test helpers for commitstore and for third-party backends.

- :class:`StoreConformance`: the conformance suite; subclass it with a ``target`` fixture.
- :class:`BackendContract`: the backend contract, one level below (a ``Backend`` and a
  backdoor, no store); subclass it with a ``subject`` fixture returning a :class:`BackendSubject`.
- :class:`LocalBackdoor`, :class:`FsspecBackdoor`, :class:`S3Backdoor`, :class:`GcsBackdoor`,
  :class:`AzureBackdoor`: raw access to a target, not through commitstore, for assertions.
- ``commitstore.testing.plugin``: pytest fixtures (``local_target``, ``memory_target``); enable
  with ``pytest_plugins = ["commitstore.testing.plugin"]``.

Needs the ``test`` extra (pytest, hypothesis).
"""

from __future__ import annotations

import pytest

# The contract's cases are asserts in this package: rewritten, so a failure shows the values.
pytest.register_assert_rewrite(
    "commitstore.testing._contract_caps",
    "commitstore.testing._contract_publish",
    "commitstore.testing._contract_tree",
)

from commitstore.testing.backdoor import (  # noqa: E402 (after the rewrite hook)
    AzureBackdoor,
    Backdoor,
    FsspecBackdoor,
    GcsBackdoor,
    LocalBackdoor,
    S3Backdoor,
)
from commitstore.testing.conformance import StoreConformance  # noqa: E402
from commitstore.testing.contract import BackendContract  # noqa: E402
from commitstore.testing.subject import BackendSubject  # noqa: E402
from commitstore.testing.target import Target, pending_paths, record_path, xxh  # noqa: E402

__all__ = [
    "AzureBackdoor",
    "Backdoor",
    "BackendContract",
    "BackendSubject",
    "FsspecBackdoor",
    "GcsBackdoor",
    "LocalBackdoor",
    "S3Backdoor",
    "StoreConformance",
    "Target",
    "pending_paths",
    "record_path",
    "xxh",
]
