"""The ``scrub`` command: a budgeted full verification of a store and its mirrors, with repair.

Exit status 0 when nothing found remains unrepaired (and every target could be listed), else 1.
A progress bar (bytes read out of the most this run reads) is drawn on a terminal, or with
``--progress``; never with ``--json``.
"""

from __future__ import annotations

import argparse
from typing import Any

from commitstore._cli_commands import EXIT_FAIL, EXIT_OK, _bar, _emit, _open
from commitstore._cli_log import fail_as, summary
from commitstore._cli_progress import ProgressBar
from commitstore.errors import CommitStoreError, IntegrityError
from commitstore.maintenance.scrub import ScrubReport, check_budget

HELP = "fully verify copies on the primary and mirrors, oldest check first; repair bad ones"
DESCRIPTION = (
    "Verifies copies in full, least recently verified first, until --budget-bytes bytes were "
    "read or --budget-seconds spent (the budget is honoured within one artifact); when each "
    "copy was last verified is kept on its target (.commitstore/scrub/), so a cron line with a "
    "budget covers every copy in ceil(total bytes / budget) runs, from any machine. Repairs a "
    "mirror's bad or missing copy from the primary and a primary copy that fails its record "
    "from a mirror copy with an identical record that verifies; never overwrites a copy that "
    "verifies, never deletes. Exit 1 when something found remains unrepaired."
)


def add_arguments(sp: argparse.ArgumentParser, url_help: str) -> None:
    """The arguments of ``scrub``."""
    sp.add_argument("primary", metavar="URL", help="the primary's " + url_help)
    sp.add_argument("mirrors", metavar="MIRROR", nargs="*", help="mirror URLs (none: primary only)")
    sp.add_argument(
        "--budget-bytes",
        type=int,
        metavar="N",
        help="stop once N bytes were read (default: no limit)",
    )
    sp.add_argument(
        "--budget-seconds",
        type=float,
        metavar="S",
        help="stop once S seconds were spent (default: no limit)",
    )
    sp.add_argument("--no-repair", action="store_true", help="report damage, repair nothing")
    sp.set_defaults(func=cmd_scrub)


def report_json(report: ScrubReport) -> dict[str, Any]:
    """``report`` as plain JSON values."""
    return {
        "ok": report.ok,
        "complete": report.complete,
        "bytes_verified": report.bytes_verified,
        "seconds": round(report.seconds, 3),
        "targets": [
            {
                "url": t.url,
                "copies": t.copies,
                "verified": len(t.verified),
                "bytes_verified": t.bytes_verified,
                "found": t.found,
                "repaired": t.repaired,
                "unrepaired": t.unrepaired,
                "superseded": t.superseded,
                "coverage": {f"{d}d": round(share, 4) for d, share in t.coverage.items()},
                "error": t.error,
            }
            for t in report.targets
        ],
    }


def report_text(report: ScrubReport) -> str:
    """``report`` as lines for a terminal: one summary line per target, then its findings."""
    lines = []
    for t in report.targets:
        if t.error:
            lines.append(f"{t.url}: not scrubbed: {t.error}")
            continue
        cover = ", ".join(f"{share:.0%} within {d}d" for d, share in t.coverage.items())
        lines.append(
            f"{t.url}: {len(t.verified)} of {t.copies} copies verified ({t.bytes_verified} "
            f"bytes), {len(t.found)} damaged, {len(t.repaired)} repaired, "
            f"{len(t.unrepaired)} unrepaired; coverage {cover}"
        )
        for name, why in t.found.items():
            if name in t.repaired:
                lines.append(f"  repaired {name} ({why}) from {t.repaired[name]}")
            elif name in t.unrepaired:
                lines.append(f"  UNREPAIRED {name} ({why}): {t.unrepaired[name]}")
            elif name in t.superseded:
                lines.append(f"  superseded {name} ({why}): {t.superseded[name]}")
    more = "" if report.complete else " (budget spent; the next run goes on from here)"
    lines.append(f"{report.bytes_verified} bytes verified in {report.seconds:.1f} s{more}")
    return "\n".join(lines)


def cmd_scrub(args: argparse.Namespace) -> int:
    check_budget(args.budget_bytes, "--budget-bytes")  # named as typed, before any I/O
    check_budget(args.budget_seconds, "--budget-seconds")
    # mirrors: the MIRROR arguments, then any --mirror (the same targets either way)
    store = _open(args, args.primary, [*args.mirrors, *(args.mirror or [])])
    bar: ProgressBar | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = _bar(args, "scrub", total)
        bar(min(done, max(total - 1, 0)))  # the end is drawn once the scrub has returned

    report = store.scrub(
        budget_bytes=args.budget_bytes,
        budget_seconds=args.budget_seconds,
        repair=not args.no_repair,
        progress=progress,
    )
    if bar is not None:
        bar(bar.total)
    _emit(args, report_json(report), report_text(report))
    if report.ok:
        return EXIT_OK
    problems = [f"{t.url}: not scrubbed: {t.error}" for t in report.targets if t.error]
    problems += [f"{t.url}: {n} unrepaired" for t in report.targets for n in t.unrepaired]
    kind = IntegrityError("") if any(t.unrepaired for t in report.targets) else CommitStoreError("")
    return fail_as(args.json, kind, summary("scrub incomplete", problems), EXIT_FAIL)
