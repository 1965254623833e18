"""SMB: commit through commitstore vs a raw smbclient write + flush, same Samba server, same run."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tests.helpers.samba import PASSWORD, SambaServer

from ._harness import MiB, pair, report


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 512) * MiB
    with tempfile.TemporaryDirectory(prefix="cs-bench-smb-") as tmp:
        server = SambaServer(Path(tmp))
        try:
            url = server.url("bench/artifact.bin")
            env = {"COMMITSTORE_SMB_PASSWORD": PASSWORD}

            def clear() -> None:
                shutil.rmtree(server.share_dir / "bench", ignore_errors=True)
                (server.share_dir / "bench").mkdir()

            results = {
                "smb_commit_vs_raw_write": pair(
                    "smb_raw_write", "smb_commit", url, size, args.repeat, clear=clear, env=env
                ),
                "smb_commit_readback_vs_raw_write": pair(
                    "smb_raw_write",
                    "smb_commit_readback",
                    url,
                    size,
                    args.repeat,
                    clear=clear,
                    env=env,
                ),
            }
        finally:
            server.stop()
    report(
        f"smb (Samba on 127.0.0.1), {size // MiB} MiB, {args.repeat} runs a side "
        "(shuffled, each from the quiet state), medians",
        results,
        {"smb_commit_vs_raw_write": 1.11},
        suite="smb",
    )
