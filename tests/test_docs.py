"""The docs agree with the code (docs/check_docs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_docs_match_code() -> None:
    script = Path(__file__).resolve().parent.parent / "docs" / "check_docs.py"
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
