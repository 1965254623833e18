"""Render the results blocks of the docs from the result files, and check that nothing typed by
hand passes for a measurement.

``python -m benchmarks.render`` rewrites every block between ``<!-- results: SUITE -->`` and
``<!-- /results -->`` (on any docs page) from ``benchmarks/results/SUITE.json``; ``--check``
changes nothing and exits 1 on any of :func:`problems`:

- a block that differs from what its file renders to;
- a result file without its block in ``docs/benchmarks.md``, or without declared sources
  (:data:`SOURCES`);
- a result file that contradicts its own runs: each ratio, median and throughput is computed
  again from the runs it lists (a ratio of counted bytes from its counts), and a stored interval
  or verdict from those (:func:`contradictions`);
- a measured-looking figure anywhere on the README or a docs page outside a results block that
  no rule of ``benchmarks/_figures.py`` accepts (a target, code, or a marker that declares it a
  default, a limit, a version...).

A result is **stale** when the code it times changed after the commit it was measured at: the
suite's :data:`SOURCES` in the working tree differ from their content at the result file's
``commit`` (a change made and undone since leaves it fresh: the same code is timed), or that
commit is not in this repository's history. A stale result's block
says so in its header (so a stale block that does not say so differs from its rendering).

Verdicts are rendered from the runs, whatever the file says: a ratio with a target ``meets`` it
only when its 95% bootstrap interval's upper bound does, is ``within noise`` when only the median
does, and ``misses`` it otherwise (``_harness.verdict``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ._figures import stray_figures
from ._harness import MiB, bootstrap, verdict

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"(<!-- results: (?P<suite>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S
)
BENCH_PAGE = "docs/benchmarks.md"

_INTEGRATION_ONLY = (
    "src/commitstore/hf.py",
    "src/commitstore/lightning.py",
    "src/commitstore/_movein.py",
)
"""Top-level modules no suite but ``async_integrations`` runs: the Hugging Face and Lightning
integrations, and where a folder moved into a write may lie (``FolderWrite.move_in``/``adopt``,
called by the HF integration only)."""
_FOLDER_WRITES = ("src/commitstore/_folderwrite.py", "src/commitstore/backends/localsource.py")
"""Modules only a folder write runs (``begin_folder``/``stage_dir``, ``move_in``, ``adopt``, and
the folder sources they take): counted by the suites that write folders."""
_ASYNC_ONLY = ("src/commitstore/_background.py",)
"""The engine of asynchronous commits (``commit_async``, ``save_async``), counted by the suites
that commit asynchronously. Every store's open also calls its ``check_inflight`` (an option's
range check); no other suite runs anything of it."""
_CORE = (
    ":(glob)src/commitstore/*.py",
    *(f":(exclude){path}" for path in (*_INTEGRATION_ONLY, *_FOLDER_WRITES, *_ASYNC_ONLY)),
    "benchmarks/_harness.py",
)
_WORKER = ("benchmarks/worker.py",)
_RENAME = ("src/commitstore/backends/base.py", "src/commitstore/backends/rename")
_OBJECT_FOLDER_WRITES = ("src/commitstore/backends/object/dirsink.py",)
"""The object stores' folder sink: only a folder written to an object store runs it (the
``scale-folder`` suite; the others write files there)."""
_OBJECT = (
    "src/commitstore/backends/base.py",
    "src/commitstore/backends/object",
    *(f":(exclude){path}" for path in _OBJECT_FOLDER_WRITES),
)
SOURCES: dict[str, tuple[str, ...]] = {
    "local": (*_CORE, *_WORKER, *_RENAME, "benchmarks/local.py"),
    "smb": (*_CORE, *_WORKER, *_RENAME, "benchmarks/smb.py"),
    "bridge": (*_CORE, *_WORKER, *_RENAME, "benchmarks/bridge.py"),
    "s3": (*_CORE, *_WORKER, *_OBJECT, "benchmarks/s3.py"),
    "s3resume": (*_CORE, *_WORKER, *_OBJECT, "benchmarks/s3resume.py"),
    "s3resume-bytes": (*_CORE, *_WORKER, *_OBJECT, "benchmarks/s3resume.py"),
    "uploadresume": (
        *_CORE,
        *_OBJECT,
        "src/commitstore/mirrors",
        "benchmarks/uploadresume.py",
        "benchmarks/s3.py",
    ),
    "gcs": (*_CORE, *_WORKER, *_OBJECT, "benchmarks/gcs.py"),
    "mirrors": (
        *_CORE,
        *_WORKER,
        *_RENAME,
        *_OBJECT,
        "src/commitstore/mirrors",
        "benchmarks/mirrors.py",
    ),
    "scale": (
        *_CORE,
        *_RENAME,
        *_OBJECT,
        "src/commitstore/maintenance",
        "benchmarks/scale.py",
        "benchmarks/scalefolder.py",
    ),
    "scale-folder": (
        *_CORE,
        *_FOLDER_WRITES,
        *_RENAME,
        *_OBJECT,
        *_OBJECT_FOLDER_WRITES,
        "src/commitstore/mirrors",
        "benchmarks/scale.py",
        "benchmarks/scalefolder.py",
    ),
    "scrub": (
        *_CORE,
        *_RENAME,
        "src/commitstore/maintenance",
        "src/commitstore/mirrors",
        "benchmarks/scrub.py",
    ),
    "dcp_local": (*_CORE, *_FOLDER_WRITES, *_RENAME, "benchmarks/dcp.py"),
    "torch": (*_CORE, *_RENAME, "benchmarks/torchio.py"),
    "torch-s3": (*_CORE, *_OBJECT, "benchmarks/torchio.py"),
    "asyncsave": (
        *_CORE,
        *_ASYNC_ONLY,
        *_RENAME,
        "benchmarks/asyncsave.py",
        "benchmarks/barecheckpoint.py",
    ),
    "async_integrations": (
        *_CORE,
        *_ASYNC_ONLY,
        *_INTEGRATION_ONLY,
        *_FOLDER_WRITES,
        *_RENAME,
        "benchmarks/integrations.py",
    ),
}
"""For each result file, the code it times (git pathspecs): the suite, the harness, the worker it
runs, the package's top-level modules (but :data:`_INTEGRATION_ONLY`, counted only where they
run) and the backends and packages the suite goes through."""

RERUN = {
    "s3resume-bytes": "./dev.sh bench s3resume",
    "torch-s3": "./dev.sh bench torch",
    "dcp_local": "./dev.sh bench dcp",
    "scale-folder": "./dev.sh bench scale",
    "async_integrations": "python -m benchmarks.integrations",
}
"""The command that writes a result file, where it is not ``./dev.sh bench <file's name>``."""


def _rss(mib: float | None) -> str:
    return "not measured" if mib is None else f"{mib:.0f} MiB"


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def staleness(root: Path, suite: str, measured: str) -> str | None:
    """Why the result of ``suite`` measured at commit ``measured`` is stale, or None (see the
    module docstring)."""
    sources = SOURCES.get(suite)
    if sources is None:
        return "no sources are declared for it"
    rev = measured.split("+", 1)[0]
    full = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").stdout.strip()
    if not full:
        return f"its commit `{rev}` is not in this repository's history"
    for group in pathspec_groups(sources):
        if _git(root, "diff", "--quiet", full, "--", *group).returncode != 0:
            return "the code it times changed after its commit"
    return None


def pathspec_groups(sources: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``sources`` as separate ``git diff`` calls: each pathspec with the ``:(exclude)``
    pathspecs that follow it. (Given to one call, git applies every exclusion to every
    pathspec, so a module excluded from the package's glob would never count, even for the
    suite that names it again.)"""
    groups: list[list[str]] = []
    for spec in sources:
        if spec.startswith(":(exclude)") and groups:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return [tuple(g) for g in groups]


_DROP_WORDS = {"dropped": "dropped", "off": "not dropped (--no-drop-caches)"}
"""How a header says each drop-caches outcome (``not permitted: ...`` is shown as it is)."""


def _rerun(suite: str) -> str:
    return RERUN.get(suite, f"./dev.sh bench {suite}")


def _header(doc: dict[str, Any], stale: str | None) -> str:
    m = doc["machine"]
    load = ", ".join(f"{x:g}" for x in m["load_average"])
    if m.get("load_average_at_start"):
        load = ", ".join(f"{x:g}" for x in m["load_average_at_start"]) + "; at the end " + load
    quiet = doc.get("quiet_state")
    quiet_text = ""
    if quiet:
        drops = "; ".join(
            f"{n} with the page cache {_DROP_WORDS.get(k, k)}"
            for k, n in sorted(quiet["drop_caches"].items())
        )
        quiet_text = f"; every timed run after sync and a {quiet['settle_s']:g} s settle" + (
            f" ({drops})" if drops else ""
        )
    banner = f"**Stale**: {stale}; run `{_rerun(doc['suite'])}` again.\n\n" if stale else ""
    return (
        banner + f"_{doc['title']}. From `benchmarks/results/{doc['suite']}.json`: commit "
        f"`{doc['commit']}`, {doc['date']}, {m['cpus']} CPUs, {m['memory_gib']:g} GiB, "
        f"{m['machine']}, Python {m['python']}, load average "
        f"{'at the start ' if m.get('load_average_at_start') else 'at the end '}{load}"
        + (f"; the suite ran {doc['suite_wall_s']:g} s" if doc.get("suite_wall_s") else "")
        + quiet_text
        + "._\n"
    )


def judged(r: dict[str, Any]) -> tuple[list[float], str | None]:
    """A measurement's 95% interval (from its runs; one point for counted bytes) and its
    verdict against its target, computed again from the runs."""
    if "ours_runs_s" in r:
        bounds = bootstrap(r["ours_runs_s"], r["baseline_runs_s"])
    else:
        bounds = [r["ratio"], r["ratio"]]
    return bounds, verdict(r["ratio"], bounds, r.get("target"))


def _verdict_text(r: dict[str, Any], digits: int = 3) -> str:
    (lo, hi), word = judged(r)
    shown = "" if word is None else (" (**misses**)" if word == "misses" else f" ({word})")
    interval = f" [95%: {lo:.{digits}f}-{hi:.{digits}f}]" if "ours_runs_s" in r else ""
    return shown + interval


def _pairs(doc: dict[str, Any]) -> str:
    robust = any("ratio_trimmed_mean" in r for r in doc["measurements"].values())
    extra_head = " trimmed-mean ratio | IQR ours / baseline (s) |" if robust else ""
    rows = [
        "| measurement | ours | baseline | ours MiB/s | baseline MiB/s | time ratio "
        f"(median) |{extra_head} runs (ours / baseline, s) | target | peak RSS ours / baseline |",
        "|---|---|---|---|---|---|" + "---|" * (2 * robust) + "---|---|---|",
    ]
    for name, r in doc["measurements"].items():
        target = "reported" if r.get("target") is None else f"<= {r['target']:.3g}"
        runs = " ".join(f"{x:.3g}" for x in r["ours_runs_s"]) + " / "
        runs += " ".join(f"{x:.3g}" for x in r["baseline_runs_s"])
        extra = ""
        if robust:
            (oq1, oq3), (bq1, bq3) = r["ours_iqr_s"], r["baseline_iqr_s"]
            extra = f" {r['ratio_trimmed_mean']:.3f} | {oq1:.3g}-{oq3:.3g} / {bq1:.3g}-{bq3:.3g} |"
        rows.append(
            f"| {name} | `{r['ours']}` | `{r['baseline']}` | {r['ours_mib_s']:.0f} | "
            f"{r['baseline_mib_s']:.0f} | **{r['ratio']:.3f}**{_verdict_text(r)} |{extra} {runs} |"
            f" {target} | {_rss(r.get('peak_rss_mib'))} / {_rss(r.get('baseline_peak_rss_mib'))} |"
        )
    return "\n".join(rows) + "\n"


def _sweeps(doc: dict[str, Any]) -> str:
    """The baseline sweeps of a result file (``read_sweeps``: plain_read per buffer size)."""
    sweeps: dict[str, Any] = doc.get("read_sweeps") or {}
    if not sweeps:
        return ""
    variants = list(next(iter(sweeps.values()))["median_s"])
    rows = [
        "\nBaseline sweep (median MiB/s per read buffer; the pairs above use the best):\n",
        "| sweep | " + " | ".join(variants) + " | best | runs each |",
        "|---|" + "---|" * len(variants) + "---|---|",
    ]
    for name, sw in sweeps.items():
        mib_s = [f"{sw['size_bytes'] / sw['median_s'][v] / 2**20:.0f}" for v in variants]
        runs = len(next(iter(sw["runs_s"].values())))
        rows.append(f"| {name} | " + " | ".join(mib_s) + f" | {sw['best']} | {runs} |")
    return "\n".join(rows) + "\n"


def _scale_verdict(r: dict[str, Any], t: float) -> str:
    """Each scan's median against the target ``t`` (seconds), with the interval of its median
    (its runs resampled against a constant): meets, within noise, misses; the worse of the two."""
    words = []
    for key in ("prune_plan", "latest_size"):
        runs = r.get(f"{key}_runs_s") or [r[f"{key}_s"]]
        lo_hi = bootstrap(runs, [1.0] * len(runs))
        words.append(verdict(r[f"{key}_s"], lo_hi, t) or "")
    word = max(words, key=["meets", "within noise", "misses"].index)
    return " (**misses**)" if word == "misses" else f" ({word})"


def _scale(doc: dict[str, Any]) -> str:
    rows = [
        '| store | artifacts | prune plan | `latest(level="size")` | target (each) | requests '
        "(prune / latest) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in doc["measurements"].items():
        if "whole store" in r:  # the floor: one bare listing of what each scan lists
            # both scans list the records only on an object store; the whole store is what a
            # plan that listed the data too would pay
            w, rec = r["whole store"], r["records"]
            rows.append(
                f"| {name} | {r['artifacts']} | {_fmt_s(rec['s'])} (the records; the whole "
                f"store: {_fmt_s(w['s'])}) | {_fmt_s(rec['s'])} (the records) | reported | "
                f"{rec['pages']} (whole store: {w['pages']}) / {rec['pages']} |"
            )
            continue
        t = r.get("target_s")
        target = "reported" if t is None else f"< {t:g} s" + _scale_verdict(r, t)
        req = (
            f"{r['prune_calls'].get('s3_requests', 0)} / {r['latest_calls'].get('s3_requests', 0)}"
        )
        rows.append(
            f"| {name} | {r['artifacts']} | {_fmt_s(r['prune_plan_s'])} | "
            f"{_fmt_s(r['latest_size_s'])} | {target} | {req} |"
        )
    return "\n".join(rows) + "\n"


def _bytes(doc: dict[str, Any]) -> str:
    rows = [
        "| measurement | ours | baseline | artifact bytes | ours bytes | baseline bytes | "
        "ratio | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["measurements"].items():
        target = "reported" if r.get("target") is None else f"<= {r['target']:.3g}"
        rows.append(
            f"| {name} | `{r['ours']}` | `{r['baseline']}` | {r['artifact_bytes']} | "
            f"{r['ours_bytes']} | {r['baseline_bytes']} | **{r['ratio']:.4f}**"
            f"{_verdict_text(r, 4)} | {target} |"
        )
    return "\n".join(rows) + "\n"


def _memory(doc: dict[str, Any]) -> str:
    m = doc.get("memory")
    if not m:
        return ""
    return (
        f"\nPeak RSS: {m['peak_before_saving_mib']:.0f} MiB with the state alone, "
        f"{m['peak_after_4_saves_mib']:.0f} MiB after 4 asynchronous saves of it "
        f"(`async_inflight=1`): an overhead of {m['overhead_mib']:.0f} MiB, "
        f"{m['overhead_in_states']:.2f} states (bound: {m['bound']}; "
        f"{'within' if m['within_bound'] else '**over**'}).\n"
    )


def _integrations(doc: dict[str, Any]) -> str:
    """``async_integrations.json`` (medians only, no target): one row per measured call."""
    rows = [
        f"_Asynchronous commits in the integrations. From "
        f"`benchmarks/results/async_integrations.json`: {doc['size_mib']} MiB state, medians "
        f"of {doc['repeat']} runs, in-process, reported without a target._\n",
        "| integration | variant | call | median |",
        "|---|---|---|---|",
    ]
    for variant, s in doc["lightning save_checkpoint blocks the caller, s (median)"].items():
        rows.append(f"| Lightning | {variant} | `save_checkpoint` blocks the caller | {s:.3f} s |")
    for variant, calls in doc["hf, s (median)"].items():
        for call, s in calls.items():
            rows.append(f"| HF Trainer | {variant} | {call.removesuffix(' s')} | {s:.3f} s |")
    return "\n".join(rows) + "\n"


def render_suite(suite: str, root: Path = ROOT) -> str:
    """The markdown block body for one suite's result file."""
    path = root / "benchmarks" / "results" / f"{suite}.json"
    if not path.exists():
        return f"_No result file yet: run `./dev.sh bench {suite}`._\n"
    doc = json.loads(path.read_text())
    if suite == "async_integrations":
        measured = doc.get("commit")
        stale = staleness(root, suite, measured) if measured else "it records no commit it measured"
        banner = f"**Stale**: {stale}; run `{_rerun(suite)}` again.\n\n" if stale else ""
        return banner + _integrations(doc)
    first: dict[str, Any] = next(iter(doc["measurements"].values()), {})
    if "prune_plan_s" in first:
        table = _scale(doc)
    elif "ours_bytes" in first:
        table = _bytes(doc)
    else:
        table = _pairs(doc) + _sweeps(doc) + _memory(doc)
    notes = f"\n{doc['notes']}\n" if doc.get("notes") else ""
    stat = f"\nStatistic: {doc['statistic']}.\n" if doc.get("statistic") else ""
    header = _header(doc, staleness(root, suite, doc["commit"]))
    return header + stat + "\n" + table + notes


def render(text: str, root: Path = ROOT) -> str:
    """``text`` with every results block re-rendered from its file."""
    return BLOCK.sub(lambda m: m.group(1) + render_suite(m.group("suite"), root) + m.group(4), text)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def contradictions(doc: dict[str, Any]) -> list[str]:
    """Where a result file's figures disagree with its own runs or counts (see the module
    docstring)."""
    found = []
    for name, r in (doc.get("measurements") or {}).items():
        if "ours_runs_s" in r:
            o, b = statistics.median(r["ours_runs_s"]), statistics.median(r["baseline_runs_s"])
            size = r.get("size_bytes")
            checks = {
                "ratio": (r.get("ratio"), o / b),
                "ours_s": (r.get("ours_s"), o),
                "baseline_s": (r.get("baseline_s"), b),
            }
            if size:
                checks["ours_mib_s"] = (r.get("ours_mib_s"), size / o / MiB)
                checks["baseline_mib_s"] = (r.get("baseline_mib_s"), size / b / MiB)
        elif "ours_bytes" in r:
            checks = {"ratio": (r.get("ratio"), r["ours_bytes"] / r["baseline_bytes"])}
        elif "prune_plan_runs_s" in r:
            checks = {
                f"{k}_s": (r.get(f"{k}_s"), statistics.median(r[f"{k}_runs_s"]))
                for k in ("prune_plan", "latest_size")
            }
        else:
            continue
        for key, (stated, computed) in checks.items():
            if not isinstance(stated, (int, float)) or not _close(stated, computed):
                found.append(f"{name}: {key} {stated} is not what its runs give ({computed:.6g})")
        if "ratio" not in checks or not isinstance(r.get("ratio"), (int, float)):
            continue
        bounds, word = judged(r)
        stated_bounds = r.get("ratio_interval_95")
        if stated_bounds is not None and not all(map(_close, stated_bounds, bounds)):
            found.append(f"{name}: its interval {stated_bounds} is not what its runs give")
        if "verdict" in r and r["verdict"] != word:
            found.append(f"{name}: verdict {r['verdict']!r}, its runs give {word!r}")
        if "ratio_interval_95" in r and word is not None and r.get("meets") != (word == "meets"):
            found.append(f"{name}: meets={r.get('meets')}, its runs give {word!r}")
    return found


def pages(root: Path) -> list[Path]:
    """The pages the check reads: the README and every docs page."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def problems(root: Path = ROOT) -> list[str]:
    """Everything the check fails on (see the module docstring)."""
    found = []
    for page in pages(root):
        text = page.read_text()
        shown = page.relative_to(root)
        if BLOCK.search(text) and render(text, root) != text:
            found.append(f"{shown}: a results block differs from its file (or its staleness)")
        found += [f"{shown}: {p}" for p in stray_figures(text)]
    bench = (root / BENCH_PAGE).read_text()
    sections = {m.group("suite") for m in BLOCK.finditer(bench)}
    for path in sorted((root / "benchmarks" / "results").glob("*.json")):
        suite = path.stem
        if suite not in sections:
            found.append(f"{BENCH_PAGE}: no results block for benchmarks/results/{path.name}")
        if suite not in SOURCES:
            found.append(f"benchmarks/results/{path.name}: no sources declared (render.SOURCES)")
        found += [
            f"benchmarks/results/{path.name}: {p}"
            for p in contradictions(json.loads(path.read_text()))
        ]
    return found


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.render")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 on a problem")
    args = p.parse_args()
    if not args.check:
        for page in pages(ROOT):
            text = page.read_text()
            if BLOCK.search(text):
                page.write_text(render(text))
    found = problems()
    for line in found:
        print(f"docs: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
