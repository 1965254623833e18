"""Walks below an open directory descriptor of a local tree (``os.fwalk``, every entry
``lstat``-ed: no symlink is ever followed, a symlink is an entry, not a folder). Entries that
vanish during the walk are left out. The caller opens the top folder and translates errors
(``posix.LocalBackend``)."""

from __future__ import annotations

import contextlib
import os
import stat as statmod

from commitstore.backends.base import FileInfo
from commitstore.backends.rename.posix._localfs import stat_info
from commitstore.layout import Parts


def _rel(dirpath: str) -> Parts:
    return tuple(p for p in dirpath.split("/") if p not in ("", "."))


def files_below(topfd: int) -> list[tuple[Parts, FileInfo]]:
    """Every entry that is not a folder, relative to ``topfd``, with its info."""
    out: list[tuple[Parts, FileInfo]] = []
    for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=topfd):
        rel = _rel(dirpath)
        for entry in (*dirnames, *filenames):
            try:
                st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not statmod.S_ISDIR(st.st_mode):
                out.append(((*rel, entry), stat_info(st)))
    return out


def folders_below(topfd: int) -> list[Parts]:
    """Every folder (not a symlink to one) relative to ``topfd``."""
    out: list[Parts] = []
    for dirpath, dirnames, _files, dfd in os.fwalk(".", dir_fd=topfd):
        rel = _rel(dirpath)
        for entry in dirnames:
            try:
                st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if statmod.S_ISDIR(st.st_mode):
                out.append((*rel, entry))
    return out


def stats_below(topfd: int) -> list[os.stat_result]:
    """The ``lstat`` of every entry below ``topfd``."""
    stats = []
    for _dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=topfd):
        for entry in (*dirnames, *filenames):
            with contextlib.suppress(FileNotFoundError):
                stats.append(os.stat(entry, dir_fd=dfd, follow_symlinks=False))
    return stats
