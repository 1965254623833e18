"""The benchmarks docs check cannot be fooled (``benchmarks/render.py``).

Each test builds a small git repository shaped like this one (a suite's source, its result file,
the README and ``docs/benchmarks.md`` rendered from it), checks that it passes, then plants one
violation: a hand-edited ratio, a deleted section, a typed figure on the README, a result older
than the code it times, a marker that covers too much. Each must fail the check.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from benchmarks import _harness, render

OURS = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
BASE = [2.0, 2.2, 1.8, 2.1, 1.9, 2.0, 2.05, 1.95]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit_all(root: Path, message: str) -> str:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message)
    return _git(root, "rev-parse", "--short=12", "HEAD")


def _measurement(ours: list[float], base: list[float], target: float | None) -> dict[str, Any]:
    r = _harness.entry("naive_write", "stage_commit", base, ours, 64 * _harness.MiB)
    _harness.judge(r, target)
    return r


def _result(commit: str, measurements: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "suite": "local",
        "title": "local, planted",
        "notes": "",
        "commit": commit,
        "date": "2026-12-02",
        "machine": {
            "cpus": 2,
            "memory_gib": 1.0,
            "machine": "x86_64",
            "python": "3.11.7",
            "load_average": [0.1, 0.1, 0.1],
            "load_average_at_start": None,
        },
        "suite_wall_s": None,
        "quiet_state": {"sync": True, "drop_caches": {"off": 16}, "settle_s": 1.0},
        "statistic": _harness.STATISTIC,
        "measurements": measurements,
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "benchmarks" / "local.py").write_text("SIZE = 1\n")
    (root / "README.md").write_text("# project\n\nSee [benchmarks](docs/benchmarks.md).\n")
    (root / "docs" / "benchmarks.md").write_text(
        "# Benchmarks\n\n<!-- results: local -->\n<!-- /results -->\n"
    )
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "bench@example.invalid")
    _git(root, "config", "user.name", "bench")
    measured = _commit_all(root, "the suite")
    result = _result(measured, {"commit_vs_naive_write_fsync": _measurement(OURS, BASE, 0.75)})
    _write(root, result)
    _render(root)
    _commit_all(root, "its result, rendered")
    return root


def _write(root: Path, doc: dict[str, Any]) -> None:
    (root / "benchmarks" / "results" / "local.json").write_text(json.dumps(doc, indent=1))


def _read(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / "benchmarks/results/local.json").read_text())
    return doc


def _render(root: Path) -> None:
    page = root / "docs" / "benchmarks.md"
    page.write_text(render.render(page.read_text(), root))


def test_the_planted_repository_passes(repo: Path) -> None:
    assert render.problems(repo) == []
    page = (repo / "docs" / "benchmarks.md").read_text()
    assert "**0.500** (meets) [95%: " in page
    assert "**Stale**" not in page


def test_a_hand_edited_ratio_fails_even_when_rendered(repo: Path) -> None:
    doc = _read(repo)
    doc["measurements"]["commit_vs_naive_write_fsync"]["ratio"] = 0.40
    _write(repo, doc)
    _render(repo)  # the table agrees with the edited file: the file disagrees with its runs
    found = render.problems(repo)
    assert any("ratio 0.4 is not what its runs give" in p for p in found), found


def test_a_hand_edited_verdict_or_interval_fails(repo: Path) -> None:
    doc = _read(repo)
    r = doc["measurements"]["commit_vs_naive_write_fsync"]
    r["ratio_interval_95"] = [0.45, 0.55]
    r["verdict"] = "misses"
    _write(repo, doc)
    _render(repo)
    found = render.problems(repo)
    assert any("interval" in p for p in found), found
    assert any("verdict 'misses'" in p for p in found), found


def test_a_result_file_without_its_section_fails(repo: Path) -> None:
    (repo / "docs" / "benchmarks.md").write_text("# Benchmarks\n\nNo tables.\n")
    found = render.problems(repo)
    assert any("no results block for benchmarks/results/local.json" in p for p in found), found


def test_a_result_file_without_declared_sources_fails(repo: Path) -> None:
    (repo / "benchmarks/results/unknown.json").write_text(json.dumps(_read(repo)))
    found = render.problems(repo)
    assert any("unknown.json: no sources declared" in p for p in found), found


@pytest.mark.parametrize(
    "typed",
    [
        "Commits run at 900 MB/s.",
        "The commit is 2.5x faster than a naive write.",
        "The commit takes 12% less time.",
        "The ratio is 0.953 on this machine.",
        "A commit of 1 GiB takes 1.2 s.",
        "Reading takes 35 ms.",
        "```\ncommit: 850 MiB/s\n```",
    ],
)
def test_a_typed_figure_on_the_readme_fails(repo: Path, typed: str) -> None:
    readme = repo / "README.md"
    readme.write_text(readme.read_text() + "\n" + typed + "\n")
    found = render.problems(repo)
    assert any(p.startswith("README.md: a figure outside a results table") for p in found), found


def test_targets_code_and_marked_configuration_pass(repo: Path) -> None:
    readme = repo / "README.md"
    readme.write_text(
        readme.read_text()
        + "\nTarget: time ratio <= 1.05, each scan < 5 s.\n"
        + "\n```python\nstore.put_bytes('x', b'0' * 4096)  # 1.5 s\n```\n"
        + "\nRecords are read up to 16 MiB. <!-- not measured (configuration): 16 MiB -->\n"
        + "\n<!-- not measured (version): 3.11 -->\n\nOn Python 3.11 and later.\n"
    )
    assert render.problems(repo) == []


@pytest.mark.parametrize(
    ("paragraph", "problem"),
    [
        (
            "Commits run at 900 MB/s. <!-- not measured (configuration): 900 MB/s -->",
            "a marker cannot declare '900 MB/s' not measured",
        ),
        (
            "A 3x gain. <!-- not measured (example): 3x -->",
            "a marker cannot declare '3x' not measured",
        ),
        (
            "Parts of 8 MiB. <!-- not measured (configuration): 8 MiB | 64 MiB -->",
            "a marker lists '64 MiB', which its paragraph does not have",
        ),
        (
            "It took 2.5 s. <!-- not measured (fast): 2.5 s -->",
            "a marker of an unknown kind (fast)",
        ),
        (
            "Parts of 8 MiB, done in 2.5 s. <!-- not measured (configuration): 8 MiB -->",
            "a figure outside a results table: '2.5 s'",
        ),
    ],
)
def test_a_marker_cannot_cover_more_than_it_says(repo: Path, paragraph: str, problem: str) -> None:
    page = repo / "docs" / "guide.md"
    page.write_text("# Guide\n\n" + paragraph + "\n")
    found = render.problems(repo)
    assert any(problem in p for p in found), found


def test_a_result_older_than_its_code_is_stale(repo: Path) -> None:
    (repo / "benchmarks" / "local.py").write_text("SIZE = 2\n")
    _commit_all(repo, "the suite changed after its result")
    found = render.problems(repo)
    assert any("a results block differs from its file (or its staleness)" in p for p in found)
    _render(repo)
    page = (repo / "docs" / "benchmarks.md").read_text()
    assert "**Stale**: the code it times changed after its commit" in page
    assert render.problems(repo) == []


def test_a_change_undone_leaves_the_result_fresh(repo: Path) -> None:
    """Staleness follows the content of the code it times, not the commits that touched it."""
    (repo / "benchmarks" / "local.py").write_text("SIZE = 2\n")
    _commit_all(repo, "the suite changed")
    assert render.staleness(repo, "local", _read(repo)["commit"]) is not None
    (repo / "benchmarks" / "local.py").write_text("SIZE = 1\n")
    _commit_all(repo, "and changed back")
    assert render.staleness(repo, "local", _read(repo)["commit"]) is None
    assert render.problems(repo) == []


def test_an_uncommitted_change_makes_the_result_stale(repo: Path) -> None:
    (repo / "benchmarks" / "local.py").write_text("SIZE = 3\n")
    assert render.staleness(repo, "local", _read(repo)["commit"]) is not None


def test_a_module_excluded_from_the_package_counts_where_named_again(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module excluded from the package's glob (run by one suite only) stales that suite's
    result and not the others'."""
    (repo / "pkg").mkdir()
    (repo / "pkg" / "core.py").write_text("A = 1\n")
    (repo / "pkg" / "only.py").write_text("B = 1\n")
    doc = _read(repo)
    doc["commit"] = _commit_all(repo, "the package")
    _write(repo, doc)
    core = (":(glob)pkg/*.py", ":(exclude)pkg/only.py")
    monkeypatch.setitem(render.SOURCES, "local", core)
    monkeypatch.setitem(render.SOURCES, "other", (*core, "pkg/only.py"))
    (repo / "pkg" / "only.py").write_text("B = 2\n")
    _commit_all(repo, "the module one suite runs")
    assert render.staleness(repo, "local", doc["commit"]) is None
    assert render.staleness(repo, "other", doc["commit"]) is not None
    (repo / "pkg" / "core.py").write_text("A = 2\n")
    _commit_all(repo, "the package")
    assert render.staleness(repo, "local", doc["commit"]) is not None


def test_a_change_elsewhere_leaves_the_result_fresh(repo: Path) -> None:
    (repo / "docs" / "other.md").write_text("# Other\n")
    _commit_all(repo, "docs only")
    assert render.problems(repo) == []


def test_a_result_from_an_unknown_commit_is_stale(repo: Path) -> None:
    doc = _read(repo)
    doc["commit"] = "0123456789ab"
    _write(repo, doc)
    _render(repo)
    page = (repo / "docs" / "benchmarks.md").read_text()
    assert "its commit `0123456789ab` is not in this repository's history" in page


def test_verdicts_come_from_the_interval(repo: Path) -> None:
    wide = [0.6, 1.9, 0.65, 2.0, 0.7, 2.1, 0.68, 0.7]  # median meets 0.75, the interval does not
    doc = _read(repo)
    doc["measurements"] = {
        "noisy": _measurement(wide, BASE, 0.75),
        "slow": _measurement([3.0] * 8, BASE, 0.75),
        "reported": _measurement(OURS, BASE, None),
    }
    assert doc["measurements"]["noisy"]["verdict"] == "within noise"
    assert doc["measurements"]["slow"]["verdict"] == "misses"
    _write(repo, doc)
    _render(repo)
    page = (repo / "docs" / "benchmarks.md").read_text()
    assert "(within noise) [95%: " in page
    assert "(**misses**) [95%: " in page
    assert render.problems(repo) == []


def test_an_old_meets_is_rendered_from_the_runs(repo: Path) -> None:
    """A file from before the interval (no ``ratio_interval_95``, ``meets`` from the median
    alone) is shown with the verdict its runs give, not the one it states."""
    wide = [0.6, 1.9, 0.65, 2.0, 0.7, 2.1, 0.68, 0.7]
    r = _measurement(wide, BASE, 0.75)
    for key in ("ratio_interval_95", "verdict", "within_noise"):
        del r[key]
    r["meets"] = True
    doc = _read(repo)
    doc["measurements"] = {"old": r}
    _write(repo, doc)
    _render(repo)
    assert "(within noise)" in (repo / "docs" / "benchmarks.md").read_text()
    assert render.problems(repo) == []


def test_the_repository_passes() -> None:
    assert render.problems() == []
