"""Render the tables of ``docs/benchmarks.md`` from ``benchmarks/results/*.json``.

``python -m benchmarks.render`` rewrites every block between ``<!-- results: SUITE -->`` and
``<!-- /results -->`` from that suite's result file; ``--check`` changes nothing and exits 1 when a
block differs from its file (the docs check runs it), or when a figure (a ratio such as ``1.05x``,
a throughput, a time in seconds) appears outside a block: every number on the page comes from a
committed result file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
DOC = DOCS / "benchmarks.md"
"""The benchmarks page; other pages may carry results blocks too (``docs/dcp.md``)."""
BLOCK = re.compile(
    r"(<!-- results: (?P<suite>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S
)
FIGURE = re.compile(r"\b\d+(\.\d+)?\s*(x\b|MiB/s|GB/s|GiB/s|ms\b|s\b)")
"""What counts as a measured figure in prose (targets are written as ``<= 1.05`` without a unit)."""


def _rss(mib: float | None) -> str:
    return "not measured" if mib is None else f"{mib:.0f} MiB"


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def _header(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = ", ".join(f"{x:g}" for x in m["load_average"])
    if m.get("load_average_at_start"):
        load = ", ".join(f"{x:g}" for x in m["load_average_at_start"]) + "; at the end " + load
    return (
        f"_{doc['title']}. From `benchmarks/results/{doc['suite']}.json`: commit "
        f"`{doc['commit']}`, {doc['date']}, {m['cpus']} CPUs, {m['memory_gib']:g} GiB, "
        f"{m['machine']}, Python {m['python']}, load average "
        f"{'at the start ' if m.get('load_average_at_start') else 'at the end '}{load}"
        + (f"; the suite ran {doc['suite_wall_s']:g} s" if doc.get("suite_wall_s") else "")
        + "._\n"
    )


def _pairs(doc: dict[str, Any]) -> str:
    robust = any("ratio_trimmed_mean" in r for r in doc["measurements"].values())
    extra_head = (
        " trimmed-mean ratio | median of pair ratios | IQR ours / baseline (s) |" if robust else ""
    )
    rows = [
        "| measurement | ours | baseline | ours MiB/s | baseline MiB/s | time ratio "
        f"(median) |{extra_head} runs (ours / baseline, s) | target | peak RSS ours / baseline |",
        "|---|---|---|---|---|---|" + "---|" * (3 * robust) + "---|---|---|",
    ]
    for name, r in doc["measurements"].items():
        target = "reported" if r.get("target") is None else f"<= {r['target']:.3g}"
        verdict = {True: " (meets)", False: " (**misses**)", None: ""}[r.get("meets")]
        if r.get("within_noise"):
            verdict = " (within noise)"
        if "ratio_interval_95" in r:
            lo, hi = r["ratio_interval_95"]
            verdict += f" [95%: {lo:.3f}-{hi:.3f}]"
        runs = " ".join(f"{x:.3g}" for x in r["ours_runs_s"]) + " / "
        runs += " ".join(f"{x:.3g}" for x in r["baseline_runs_s"])
        extra = ""
        if robust:
            (oq1, oq3), (bq1, bq3) = r["ours_iqr_s"], r["baseline_iqr_s"]
            extra = (
                f" {r['ratio_trimmed_mean']:.3f} | {r['pair_ratio_median']:.3f} | "
                f"{oq1:.3g}-{oq3:.3g} / {bq1:.3g}-{bq3:.3g} |"
            )
        rows.append(
            f"| {name} | `{r['ours']}` | `{r['baseline']}` | {r['ours_mib_s']:.0f} | "
            f"{r['baseline_mib_s']:.0f} | **{r['ratio']:.3f}**{verdict} |{extra} {runs} | "
            f"{target} | {_rss(r.get('peak_rss_mib'))} / {_rss(r.get('baseline_peak_rss_mib'))} |"
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
        worst = max(r["prune_plan_s"], r["latest_size_s"])
        target = (
            "reported"
            if t is None
            else f"< {t:g} s" + (" (meets)" if worst < t else " (**misses**)")
        )
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
        verdict = {True: " (meets)", False: " (**misses**)", None: ""}[r.get("meets")]
        if r.get("within_noise"):
            verdict = " (within noise)"
        if "ratio_interval_95" in r:
            lo, hi = r["ratio_interval_95"]
            verdict += f" [95%: {lo:.3f}-{hi:.3f}]"
        rows.append(
            f"| {name} | `{r['ours']}` | `{r['baseline']}` | {r['artifact_bytes']} | "
            f"{r['ours_bytes']} | {r['baseline_bytes']} | **{r['ratio']:.4f}**{verdict} | "
            f"{target} |"
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


def render_suite(suite: str) -> str:
    """The markdown block body for one suite's result file."""
    path = RESULTS / f"{suite}.json"
    if not path.exists():
        return f"_No result file yet: run `./dev.sh bench {suite}`._\n"
    doc = json.loads(path.read_text())
    first: dict[str, Any] = next(iter(doc["measurements"].values()), {})
    if "prune_plan_s" in first:
        table = _scale(doc)
    elif "ours_bytes" in first:
        table = _bytes(doc)
    else:
        table = _pairs(doc) + _sweeps(doc) + _memory(doc)
    notes = f"\n{doc['notes']}\n" if doc.get("notes") else ""
    stat = f"\nStatistic: {doc['statistic']}.\n" if doc.get("statistic") else ""
    return _header(doc) + stat + "\n" + table + notes


def render(text: str) -> str:
    """``text`` with every results block re-rendered from its file."""
    return BLOCK.sub(lambda m: m.group(1) + render_suite(m.group("suite")) + m.group(4), text)


def stray_figures(text: str) -> list[str]:
    """Lines outside results blocks that carry a measured figure."""
    outside = BLOCK.sub("", text)
    in_code = False
    found = []
    for line in outside.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and FIGURE.search(line):
            found.append(line)
    return found


def problems() -> list[str]:
    """Stale blocks on any docs page, and stray figures on the benchmarks page."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        if BLOCK.search(text) and render(text) != text:
            found.append(f"{page.name}: a results table differs from benchmarks/results")
    found += [
        f"benchmarks.md: a figure outside a results table: {line}"
        for line in stray_figures(DOC.read_text())
    ]
    return found


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.render")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = p.parse_args()
    if not args.check:
        for page in sorted(DOCS.glob("*.md")):
            text = page.read_text()
            if BLOCK.search(text):
                page.write_text(render(text))
    found = problems()
    for line in found:
        print(f"docs: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
