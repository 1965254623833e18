"""``commitstore`` command line: a thin layer over the public API.

Exit status: 0 all good; 1 an integrity problem was found or an operation failed; 2 usage error
(a local path that names no folder, for every command but ``put``, is one: nothing is created).
Expected failures print one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from commitstore import CommitStore, __version__, open_store
from commitstore._order import arrange_records
from commitstore._progress import ProgressBar
from commitstore._scan import scan_records
from commitstore.errors import CommitStoreError, ConfigurationError, InvalidNameError
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
        "metadata": rec.metadata,
        "files": [{"path": f.path, "size": f.size, "digest": f.digest} for f in rec.files],
    }


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def _local_path(url: str) -> str | None:
    """The folder a local-path or ``file://`` URL names; None for other schemes."""
    if url.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        return unquote(urlsplit(url).path)
    return None if "://" in url else os.path.expanduser(url)


def _open(
    args: argparse.Namespace,
    url: str,
    mirrors: list[str] | None = None,
    *,
    existing: bool = True,
) -> CommitStore:
    """open_store with the ``-o KEY=VALUE`` storage options and ``--mirror`` URLs of the command
    line (mirrors replicate before the command returns). ``existing``: a local path must name
    a folder already (a mistyped path is a usage error, never created)."""
    path = _local_path(url)
    if existing and path is not None and not os.path.isdir(path):
        what = "is not a folder" if os.path.exists(path) else "does not exist"
        raise ConfigurationError(f"no store at {url}: {path} {what}")
    options: dict[str, Any] = {}
    for item in getattr(args, "option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"storage options look like KEY=VALUE, not {item!r}")
        options[key] = _value(value)
    mirrors = mirrors if mirrors is not None else (getattr(args, "mirror", None) or [])
    return open_store(url, mirrors=mirrors, mirror_mode="sync", **options)


def _emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, indent=2) if args.json else text)


def cmd_ls(args: argparse.Namespace) -> int:
    good, bad = scan_records(_open(args, args.url).backend)
    records = arrange_records(good)
    lines = [f"{'STEP':>8}  {'SIZE':>14}  {'DIGEST':<20}  NAME"]
    for r in records:
        step = "-" if r.step is None else str(r.step)
        lines.append(f"{step:>8}  {r.size:>14}  {r.digest[:20]:<20}  {r.name}")
    lines += [f"{'?':>8}  {'?':>14}  {'bad_record':<20}  {b.name}  ({b.detail})" for b in bad]
    _emit(args, [record_json(r) for r in records], "\n".join(lines))
    if args.json:  # the list stays records only; bad ones go to stderr
        for b in bad:
            print(f"commitstore: bad_record {b.name}: {b.detail}", file=sys.stderr)
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
    return EXIT_OK if report.ok else EXIT_FAIL


def cmd_latest(args: argparse.Namespace) -> int:
    rec = _open(args, args.url).latest(level=args.level)
    if rec is None:
        _emit(args, None, "no whole artifact found")
        return EXIT_FAIL
    _emit(args, record_json(rec), f"{rec.name} (step {rec.step}, {rec.size} bytes, {rec.digest})")
    return EXIT_OK


def cmd_put(args: argparse.Namespace) -> int:
    name = args.name or os.path.basename(os.path.abspath(args.local))
    store = _open(args, args.url, existing=False)
    if os.path.isdir(args.local):
        import shutil

        with store.stage_dir(name, step=args.step, overwrite=args.overwrite) as d:
            shutil.copytree(args.local, d, dirs_exist_ok=True)
        rec = store.record(name)
    else:
        bar = ProgressBar(f"put {name}", os.path.getsize(args.local))
        rec = store.put_file(
            name, args.local, step=args.step, overwrite=args.overwrite, progress=bar
        )
    _emit(args, record_json(rec), f"committed {rec.name} ({rec.size} bytes, {rec.digest})")
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
    bar = ProgressBar(f"get {args.name}", rec.size)
    store.get_file(args.name, args.dest, verify=args.verify, progress=bar)
    _emit(
        args,
        {**record_json(rec), "dest": dest},
        f"{dest}: {rec.size} bytes, verified ({args.verify})",
    )
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    info = _open(args, args.url, existing=False).describe()
    text = "\n".join(f"{k}: {v}" for k, v in info.items())
    _emit(args, info, text)
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
            {"url": t.url, "deleted": t.deleted, "kept": t.kept, "skipped": t.skipped}
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
    _emit(args, doc, "\n".join(lines))
    return EXIT_OK


def cmd_adopt(args: argparse.Namespace) -> int:
    report = _open(args, args.url).adopt(args.name, trust=args.trust)
    doc = {"adopted": report.adopted, "rejected": report.rejected}
    lines = [f"adopted {n}" for n in report.adopted]
    lines += [f"rejected {n}: {why}" for n, why in report.rejected.items()]
    _emit(args, doc, "\n".join(lines) or "nothing to adopt")
    truncated = any("unknown format" not in why for why in report.rejected.values())
    return EXIT_FAIL if truncated else EXIT_OK


def cmd_sync(args: argparse.Namespace) -> int:
    store = _open(args, args.primary, list(args.mirrors))
    report = store.sync(repair=not args.no_repair)
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
    return EXIT_OK if report.ok else EXIT_FAIL


def cmd_demo(args: argparse.Namespace) -> int:
    from commitstore.demo import run_demo

    return run_demo(args.dir, as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="commitstore", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"commitstore {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.add_argument("--mirror", action="append", metavar="URL", help="mirror (repeatable)")
        sp.add_argument(
            "-o",
            "--option",
            action="append",
            metavar="KEY=VALUE",
            help="storage option, e.g. strategy=bridge, readback=false, port=1445 (repeatable); "
            "SMB passwords come from COMMITSTORE_SMB_PASSWORD",
        )
        return sp

    sp = add("ls", "list committed artifacts, oldest to newest")
    sp.add_argument("url")
    sp.set_defaults(func=cmd_ls)
    sp = add("verify", "check artifacts against their records")
    sp.add_argument("url")
    sp.add_argument("name", nargs="?")
    sp.add_argument("--level", choices=("size", "full"), default="full")
    sp.set_defaults(func=cmd_verify)
    sp = add("latest", "the newest artifact that verifies")
    sp.add_argument("url")
    sp.add_argument("--level", choices=("size", "full"), default="full")
    sp.set_defaults(func=cmd_latest)
    sp = add("put", "commit a local file or folder")
    sp.add_argument("local")
    sp.add_argument("url")
    sp.add_argument("--name")
    sp.add_argument("--step", type=int)
    sp.add_argument("--overwrite", action="store_true")
    sp.set_defaults(func=cmd_put)
    sp = add("get", "copy an artifact out, verified")
    sp.add_argument("url")
    sp.add_argument("name")
    sp.add_argument(
        "dest",
        help="local path; an existing folder receives the artifact inside it under its base "
        "name (as cp); a local folder is never replaced, nor a file by a folder artifact",
    )
    sp.add_argument("--verify", choices=("size", "full", "none"), default="full")
    sp.set_defaults(func=cmd_get)
    sp = add("info", "which commit strategy a store uses, and why")
    sp.add_argument("url")
    sp.set_defaults(func=cmd_info)
    sp = add("gc", "remove staging files and unfinished uploads left by dead writers")
    sp.add_argument("url")
    sp.add_argument("--min-age", type=float, default=3600, help="seconds (default 3600)")
    sp.add_argument("--dry-run", action="store_true")
    sp.set_defaults(func=cmd_gc)
    sp = add("prune", "delete committed artifacts outside the keep-set (guarded)")
    sp.add_argument("url")
    sp.add_argument("--keep-last", type=int, required=True)
    sp.add_argument("--keep-every", type=int)
    sp.add_argument("--min-age", type=float, default=300)
    sp.add_argument("--dry-run", action="store_true")
    sp.set_defaults(func=cmd_prune)
    sp = add("adopt", "write records for whole checkpoints that have none")
    sp.add_argument("url")
    sp.add_argument("name", nargs="?")
    sp.add_argument("--trust", action="store_true", help="adopt unknown formats too")
    sp.set_defaults(func=cmd_adopt)
    sp = add("sync", "copy to mirrors what they lack, repair what fails verification")
    sp.add_argument("primary")
    sp.add_argument("mirrors", nargs="+")
    sp.add_argument("--no-repair", action="store_true")
    sp.set_defaults(func=cmd_sync)
    sp = add("demo", "simulated training run: crash, resume, corruption caught")
    sp.add_argument("dir", nargs="?", default="commitstore-demo")
    sp.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (also used by ``python -m commitstore``)."""
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("commitstore: %(levelname)s: %(message)s"))
    logger = logging.getLogger("commitstore")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
        return code
    except (InvalidNameError, ConfigurationError) as exc:
        print(f"commitstore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (CommitStoreError, OSError) as exc:
        print(f"commitstore: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("commitstore: interrupted", file=sys.stderr)
        return 130
    finally:
        logger.removeHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
