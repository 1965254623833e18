"""A damaged records tree is ``bad_record`` wherever a read says so (a folder of it, or the
records folder itself, replaced by a symlink), and ``put_file`` of a folder is a bad argument."""

from __future__ import annotations

from pathlib import Path

import pytest

import commitstore
from commitstore import open_store


def test_put_file_of_a_folder_is_a_configuration_error_said_once(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    with pytest.raises(commitstore.ConfigurationError) as err:
        store.put_file("x.pt", folder)
    message = str(err.value)
    assert message.count(str(folder)) == 1, message
    assert "stage_dir" in message and "folder" in message
    assert not (tmp_path / "s").exists()  # refused before any write: not even the root
