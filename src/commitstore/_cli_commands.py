"""The command line's commands: each takes the parsed arguments, prints its result (text, or
one JSON document under ``--json``) and returns the exit status."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from commitstore import CommitStore
from commitstore._cli_log import (
    TARGETS,
    exit_code_of,
    fail,
    fail_as,
    message_of,
    stderr_json,
    summary,
)
from commitstore._cli_progress import ProgressBar
from commitstore._cli_targets import open_target
from commitstore.errors import (
    AlreadyExistsError,
    CommitError,
    CommitStoreError,
    IntegrityError,
    NameConflictError,
    NotFoundError,
)
from commitstore.layout import META_DIR, validate_name
from commitstore.records import Record, VerifyReport

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def record_json(rec: Record) -> dict[str, Any]:
    """A record as plain JSON values (the same fields as the on-disk record)."""
    return {
        "name": rec.name,
        "kind": rec.kind,
        "step": rec.step,
        "size": rec.size,
        "digest": rec.digest,
        "created": rec.created.isoformat(),
        "alias": rec.alias,
        "metadata": rec.metadata,
        "files": [{"path": f.path, "size": f.size, "digest": f.digest} for f in rec.files],
    }


def _open(
    args: argparse.Namespace,
    url: str,
    mirrors: list[str] | None = None,
    *,
    existing: bool = True,
) -> CommitStore:
    """The command's store: ``url`` with its ``-o`` options, and its mirrors (``mirrors``, else
    ``--mirror``) with their ``-O`` options."""
    mirrors = mirrors if mirrors is not None else list(getattr(args, "mirror", None) or [])
    store = open_target(
        url,
        mirrors,
        getattr(args, "option", None),
        getattr(args, "mirror_option", None),
        existing=existing,
    )
    TARGETS[:] = [store.url, *(m.url for m in store.mirrors)]
    return store


def _bar(args: argparse.Namespace, label: str, total: int) -> ProgressBar:
    return ProgressBar(label, total, force=args.progress, enabled=not args.json)


def _emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, indent=2) if args.json else text)


def _created(rec: Record) -> str:
    return rec.created.strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_ls(args: argparse.Namespace) -> int:
    records, bad = _open(args, args.url).scan()
    lines = [f"{'STEP':>8}  {'SIZE':>14}  {'CREATED (UTC)':<20}  {'DIGEST':<20}  NAME"]
    for r in records:
        step = "-" if r.step is None else str(r.step)
        name = f"{r.name}  alias" if r.alias else r.name
        lines.append(f"{step:>8}  {r.size:>14}  {_created(r):<20}  {r.digest[:20]:<20}  {name}")
    lines += [
        f"{'?':>8}  {'?':>14}  {'?':<20}  {'bad_record':<20}  {b.name}  ({b.detail})" for b in bad
    ]
    _emit(args, [record_json(r) for r in records], "\n".join(lines))
    if args.json:  # the list stays records only; bad ones go to stderr, one JSON line each
        for b in bad:
            stderr_json({"bad_record": {"name": b.name, "detail": b.detail}})
    return EXIT_OK


def _report_text(report: VerifyReport) -> str:
    lines = [
        f"{r.status:<14} {r.name}" + (f"  ({r.detail})" if r.detail else "") for r in report.results
    ]
    lines.append("OK" if report.ok else "PROBLEMS FOUND")
    return "\n".join(lines)


def cmd_verify(args: argparse.Namespace) -> int:
    report = _open(args, args.url).verify(args.name, level=args.level)
    doc = {
        "ok": report.ok,
        "results": [
            {"name": r.name, "status": r.status, "detail": r.detail} for r in report.results
        ],
    }
    _emit(args, doc, _report_text(report))
    if report.ok:
        return EXIT_OK
    bad = [r for r in report.results if r.status not in ("ok", "no_record")]
    problems = [f"{r.name}: {r.status}" for r in bad]
    found = IntegrityError("", name=bad[0].name, status=bad[0].status)
    what = f"{len(bad)} of {len(report.results)} fail the check"
    return fail_as(args.json, found, summary(what, problems), EXIT_FAIL)


def cmd_latest(args: argparse.Namespace) -> int:
    store = _open(args, args.url)
    rec = store.latest(level=args.level)
    if rec is None:  # the result document is null; the text goes to stderr as the error
        if args.json:
            _emit(args, None, "")
        return fail(args.json, NotFoundError(f"no whole artifact found in {store.url}"), EXIT_FAIL)
    _emit(args, record_json(rec), f"{rec.name} (step {rec.step}, {rec.size} bytes, {rec.digest})")
    return EXIT_OK


def _copy_into(src: str, dest: Path, bar: ProgressBar) -> None:
    """Copy the folder ``src`` into ``dest`` (which exists), reporting bytes to ``bar``."""
    done = 0

    def copy(s: str, d: str) -> str:
        nonlocal done
        out = shutil.copy2(s, d)
        done += os.path.getsize(s)
        bar(done)
        return str(out)

    shutil.copytree(src, dest, dirs_exist_ok=True, copy_function=copy)


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _figures(rec: Record, seconds: float) -> dict[str, float]:
    """Bytes, seconds and MB/s of one commit: the record's own ``outcome`` figures when it has
    them, else the command's timing of the whole call."""
    outcome = getattr(rec, "outcome", None)
    secs = getattr(outcome, "seconds", None)
    seconds = float(secs) if isinstance(secs, int | float) else seconds
    rate = rec.size / seconds / 1e6 if seconds > 0 else 0.0
    return {"seconds": round(seconds, 3), "mb_per_s": round(rate, 1)}


def cmd_put(args: argparse.Namespace) -> int:
    """Commit LOCAL (a file, or a folder as one folder artifact) as NAME."""
    if not os.path.exists(args.local):  # a missing source is refused before any I/O
        raise NotFoundError(f"{args.local}: no such file or folder")
    name = args.name or os.path.basename(os.path.abspath(args.local))
    validate_name(name)
    store = _open(args, args.url, existing=False)
    started = time.monotonic()
    if os.path.isdir(args.local):
        bar = _bar(args, f"put {name}", _folder_bytes(args.local))
        got: list[Record] = []  # the commit's own record (readable even before its record is)
        with store.stage_dir(name, step=args.step, overwrite=args.overwrite, records=got) as d:
            _copy_into(args.local, d, bar)
            bar(bar.total)
        rec = got[0]
    else:
        bar = _bar(args, f"put {name}", os.path.getsize(args.local))
        rec = store.put_file(
            name, args.local, step=args.step, overwrite=args.overwrite, progress=bar
        )
    figures = _figures(rec, time.monotonic() - started)
    text = (
        f"committed {rec.name} to {store.url} ({rec.size} bytes, {rec.digest}, "
        f"{figures['seconds']:.2f} s, {figures['mb_per_s']:.1f} MB/s)"
    )
    doc = {**record_json(rec), "url": store.url, **figures}
    if rec.outcome is not None:
        doc["durable"], doc["notes"] = rec.outcome.durable, list(rec.outcome.notes)
        if not rec.outcome.durable:
            text += f"; durability unconfirmed: {'; '.join(rec.outcome.notes)}"
    _emit(args, doc, text)
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    """A verified copy of NAME at DEST; an existing folder DEST receives it inside, under its
    base name (as ``cp``). A local folder is never replaced, nor a file by a folder artifact:
    exit 1, one line on stderr, nothing changed."""
    store = _open(args, args.url)
    rec = store.record(args.name)
    dest = args.dest
    if os.path.isdir(dest):
        dest = os.path.join(dest, args.name.rsplit("/", 1)[-1])
    bar = _bar(args, f"get {args.name}", rec.size)
    store.get_file(args.name, args.dest, verify=args.verify, progress=bar)
    _emit(
        args,
        {**record_json(rec), "dest": dest},
        f"{dest}: {rec.size} bytes, verified ({args.verify})",
    )
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete each NAME (record first, then data); every name is checked before any I/O. A
    folder path holding other committed artifacts is refused (NameConflictError), as by
    ``delete``. Goes on after a failed name; the exit status is the worst one."""
    for name in args.names:
        validate_name(name)
    store = _open(args, args.url)
    names = {r.name for r in store.list()} if args.dry_run else set()
    done: list[str] = []
    errors: dict[str, str] = {}
    failures: dict[str, Exception] = {}
    code = EXIT_OK
    for name in args.names:
        try:
            if args.dry_run:
                _would_delete(name, names)
            else:
                store.delete(name)
        except Exception as exc:
            mapped = exit_code_of(exc)
            if mapped is None:
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
            failures[name] = exc
            code = max(code, mapped)
        else:
            done.append(name)
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {n} from {store.url}" for n in done]
    if args.json or lines:
        _emit(args, {"dry_run": args.dry_run, "removed": done, "failed": errors}, "\n".join(lines))
    if not failures:
        return code
    # one error line on stderr: every failed name, typed as the first of the worst status
    worst = next(exc for exc in failures.values() if exit_code_of(exc) == code)
    problems = [f"{n}: {message_of(exc)}" for n, exc in failures.items()]
    return fail_as(args.json, worst, summary("not removed", problems), code)


def _would_delete(name: str, committed: set[str]) -> None:
    """What ``delete`` would raise for ``name``, judged from the committed names."""
    if name in committed:
        return
    if any(n.startswith(name + "/") for n in committed):
        raise NameConflictError(f"{name} is a folder path holding committed artifacts")
    raise NotFoundError(f"{name} is not committed", name=name)


def cmd_restore(args: argparse.Namespace) -> int:
    """Copy a verified mirror copy of NAME back to the primary."""
    validate_name(args.name)
    sources = list(args.source or []) + list(args.mirror or [])
    if not sources:
        from commitstore.errors import ConfigurationError

        raise ConfigurationError("restore needs a mirror to copy from: --from MIRROR")
    store = _open(args, args.url, sources, existing=False)
    source = store.mirrors[0] if args.source and len(args.source) == 1 else None
    rec = store.restore(args.name, source=source, overwrite=args.overwrite)
    _emit(
        args,
        {**record_json(rec), "url": store.url},
        f"restored {rec.name} to {store.url} ({rec.size} bytes, {rec.digest})",
    )
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """The strategy a store uses (or would use) and whether it exists; creates nothing. A store
    that does not exist is a usage error (exit 2), its strategy still shown."""
    store = _open(args, args.url, existing=False)
    info = {**store.describe(), "exists": store.exists()}
    text = "\n".join(f"{k}: {v}" for k, v in info.items())
    _emit(args, info, text)
    if not info["exists"]:
        missing = NotFoundError(
            f"no store at {store.url} (nothing was created; the first write creates it)"
        )
        return fail(bool(args.json), missing, EXIT_USAGE)
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    report = _open(args, args.url).gc(min_age=args.min_age, dry_run=args.dry_run)
    doc = {
        "dry_run": report.dry_run,
        "removed": [{"path": i.path, "kind": i.kind, "age": i.age} for i in report.removed],
        "kept": [
            {"path": i.path, "kind": i.kind, "age": i.age, "reason": i.reason} for i in report.kept
        ],
    }
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {i.kind} {i.path}" for i in report.removed]
    lines += [f"kept {i.kind} {i.path} ({i.reason})" for i in report.kept]
    lines.append(f"{len(report.removed)} {verb}, {len(report.kept)} kept")
    _emit(args, doc, "\n".join(lines))
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    report = _open(args, args.url).prune(
        keep_last=args.keep_last,
        keep_every=args.keep_every,
        min_age=args.min_age,
        dry_run=args.dry_run,
    )
    doc = {
        "dry_run": report.dry_run,
        "targets": [
            {
                "url": t.url,
                "deleted": t.deleted,
                "kept": t.kept,
                "skipped": t.skipped,
                "error": t.error,
            }
            for t in report.targets
        ],
    }
    verb = "would delete" if args.dry_run else "deleted"
    lines = []
    for t in report.targets:
        lines += [f"{t.url}: {verb} {n}" for n in t.deleted]
        lines += [f"{t.url}: kept {n} ({why})" for n, why in t.skipped.items()]
        lines.append(
            f"{t.url}: {len(t.deleted)} {verb}, {len(t.kept)} in the keep-set, "
            f"{len(t.skipped)} protected"
        )
        if t.error is not None:
            lines.append(f"{t.url}: {t.error}")
    _emit(args, doc, "\n".join(lines))
    return EXIT_OK


def cmd_adopt(args: argparse.Namespace) -> int:
    report = _open(args, args.url).adopt(args.name, trust=args.trust)
    doc = {"adopted": report.adopted, "rejected": report.rejected}
    lines = [f"adopted {n}" for n in report.adopted]
    lines += [f"rejected {n}: {why}" for n, why in report.rejected.items()]
    _emit(args, doc, "\n".join(lines) or "nothing to adopt")
    damaged = [f"{n}: {why}" for n, why in report.rejected.items() if "unknown format" not in why]
    if not damaged:
        return EXIT_OK
    return fail_as(args.json, IntegrityError(""), summary("not adopted", damaged), EXIT_FAIL)


def cmd_sync(args: argparse.Namespace) -> int:
    store = _open(args, args.primary, list(args.mirrors))
    bar = _bar(args, "sync", 0)
    if not args.json and (args.progress or bar.stream.isatty()):
        # the most it may copy: everything, to every mirror
        total = sum(r.size for r in store.list()) * len(store.mirrors)
        bar = _bar(args, "sync", total)
    shown = bar  # the end is drawn once sync has returned

    def progress(done: int) -> None:
        shown(min(done, max(shown.total - 1, 0)))

    report = store.sync(repair=not args.no_repair, progress=progress if bar.enabled else None)
    bar(bar.total)
    doc = {
        "ok": report.ok,
        "primary_bad": report.primary_bad,
        "mirrors": [
            {
                "url": m.url,
                "copied": m.copied,
                "repaired": m.repaired,
                "ok": m.ok,
                "foreign": m.foreign,
                "failed": m.failed,
            }
            for m in report.mirrors
        ],
    }
    lines = [
        f"primary: {name} fails its check ({why}); not copied"
        for name, why in report.primary_bad.items()
    ]
    for m in report.mirrors:
        lines.append(
            f"{m.url}: {len(m.copied)} copied, {len(m.repaired)} repaired, {len(m.ok)} ok, "
            f"{len(m.foreign)} foreign (left alone), {len(m.failed)} failed"
        )
        lines += [f"  failed {name}: {err}" for name, err in m.failed.items()]
    _emit(args, doc, "\n".join(lines))
    if report.ok:
        return EXIT_OK
    problems = [f"primary: {n} fails its check" for n in report.primary_bad]
    problems += [
        f"{m.url}: {n} not copied: {why}" for m in report.mirrors for n, why in m.failed.items()
    ]
    kind = IntegrityError("") if report.primary_bad else CommitError("")
    return fail_as(args.json, kind, summary("sync incomplete", problems), EXIT_FAIL)


def cmd_demo(args: argparse.Namespace) -> int:
    """The demo in DIR/store; a DIR/store that is not a demo's is refused (exit 1, one error
    line), and a guarantee that failed is the one error line besides the demo's report."""
    from commitstore.demo import run_demo

    root = Path(args.dir).resolve() / "store"
    if root.exists() and not (root / META_DIR).exists():
        raise AlreadyExistsError(f"{root} exists and is not a commitstore demo store")
    code = run_demo(args.dir, as_json=args.json)
    if code == EXIT_OK:
        return code
    return fail(args.json, CommitStoreError("demo: a guarantee failed (see the report)"), code)
