"""A PEP 517 build backend in the standard library alone (wheels only).

The test interpreter's setuptools may predate its built-in ``bdist_wheel`` (a new venv on Python
3.11 ships setuptools 65 without ``wheel``), and the test must not need the network; so the
package builds itself. Metadata and entry points come from ``pyproject.toml``.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pip vendors tomli for Python 3.10
    from pip._vendor import tomli as tomllib

HERE = Path(__file__).resolve().parent
MODULES = ["myproto_backend.py"]


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    dist = project["name"].replace("-", "_")
    info = f"{dist}-{project['version']}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    metadata += "".join(f"Requires-Dist: {d}\n" for d in project.get("dependencies", []))
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in project.get("entry-points", {}).items()
    )
    files = {m: (HERE / m).read_bytes() for m in MODULES}
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: build_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = (
        "".join(f"{n},{_digest(d)},{len(d)}\n" for n, d in files.items()) + f"{info}/RECORD,,\n"
    )
    files[f"{info}/RECORD"] = record.encode()
    name = f"{dist}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as whl:
        for n, d in files.items():
            whl.writestr(n, d)
    return name
