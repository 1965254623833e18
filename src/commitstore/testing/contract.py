"""The backend contract: what the core relies on from every :class:`~commitstore.backends.Backend`,
checked one level below the store-level conformance suite (:class:`StoreConformance`).

A backend author subclasses :class:`BackendContract` and gives a ``subject`` fixture returning a
:class:`~commitstore.testing.subject.BackendSubject`: a fresh backend on an empty root, a backdoor
that reads the same storage without any backend, and optionally a way to open a second instance
(racing writers) and to break a connection (``client_retries``)::

    class TestMyBackend(BackendContract):
        @pytest.fixture
        def subject(self, tmp_path):
            return BackendSubject(MyBackend(tmp_path / "root"), LocalBackdoor(tmp_path / "root"),
                                  reopen=lambda: MyBackend(tmp_path / "root"))

Every case observes the storage through the backdoor, so a backend cannot pass by agreeing with
itself. The cases (each docstring states the guarantee):

- publishing (``_contract_publish``): staged file and folder bytes invisible until ``publish``;
  ``abort`` leaves nothing; ``CREATE`` refuses a taken name; ``REPLACE`` leaves exactly the new
  version;
- capabilities (``_contract_caps``, ``_contract_publish``, ``_contract_flags``): one
  ``test_capability_<field>`` per :class:`~commitstore.backends.Capabilities` field, holding
  the backend to what it declares (racing ``CREATE`` publishes have one winner iff
  ``exclusive_create``; readers see old or new iff ``atomic_replace``; a folder appears whole
  iff ``atomic_dir_publish``; staged bytes sit under a staging name iff ``staging_names``; a
  sink takes a rereadable source iff ``reread_bodies``; ...);
- reading and removing (``_contract_tree``): ``stat``, ``walk``, ``open_read``, ``read_small``,
  ``remove``, ``remove_files``, ``remove_empty_folder``, ``root_exists``.
"""

from __future__ import annotations

import pytest

from commitstore.testing._contract_caps import CapabilityContract
from commitstore.testing._contract_flags import FlagContract
from commitstore.testing._contract_publish import PublishContract
from commitstore.testing._contract_tree import TreeContract
from commitstore.testing.subject import BackendSubject


class BackendContract(PublishContract, CapabilityContract, FlagContract, TreeContract):
    """Every contract case. Subclasses override the ``subject`` fixture."""

    @pytest.fixture
    def subject(self) -> BackendSubject:
        raise NotImplementedError("subclasses provide a subject fixture")
