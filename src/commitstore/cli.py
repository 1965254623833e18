"""``commitstore`` command line: a thin layer over the public API.

Exit status: 0 all good; 1 an integrity problem was found or an operation failed; 2 usage error
(a local path that names no folder, for every command but ``put``, is one: nothing is created).
Expected failures print one line on stderr, never a traceback. With ``--json`` every line on
stderr is one JSON object: an error is ``{"error": {"type", "message", "exit_code", ...}}``
(with the same exit status as without ``--json``; ``errno`` and ``status`` where the error has
them), a log message ``{"log": {"level", "message"}}``; stdout holds only the result document.
"""

from __future__ import annotations

import argparse
import contextvars
import errno
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from commitstore import CommitStore, __version__, open_store
from commitstore._order import arrange_records
from commitstore._progress import ProgressBar
from commitstore._scan import scan_records
from commitstore.errors import (
    CommitStoreError,
    ConfigurationError,
    InvalidNameError,
    NotFoundError,
    StorageError,
)
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
    """A ``-o KEY=VALUE`` value: a bool, an integer, a finite number, else the text (each
    backend then checks the kind it needs: ``readback=maybe`` stays text and is refused)."""
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


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
    line (mirrors replicate before the command returns). ``existing``: the store must exist
    already (a mistyped path or URL is a usage error; nothing is created)."""
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
    store = open_store(url, mirrors=mirrors, mirror_mode="sync", **options)
    if existing and path is None and not store.backend.root_exists():
        raise ConfigurationError(f"no store at {store.url}: nothing there (nothing was created)")
    return store


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
    if args.json:  # the list stays records only; bad ones go to stderr, one JSON line each
        for b in bad:
            _stderr_json({"bad_record": {"name": b.name, "detail": b.detail}})
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

        got: list[Record] = []
        with store._stage_dir(name, got, step=args.step, overwrite=args.overwrite) as d:
            shutil.copytree(args.local, d, dirs_exist_ok=True)
        rec = got[0]
    else:
        bar = ProgressBar(f"put {name}", os.path.getsize(args.local))
        rec = store.put_file(
            name, args.local, step=args.step, overwrite=args.overwrite, progress=bar
        )
    doc, text = record_json(rec), f"committed {rec.name} ({rec.size} bytes, {rec.digest})"
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
    bar = ProgressBar(f"get {args.name}", rec.size)
    store.get_file(args.name, args.dest, verify=args.verify, progress=bar)
    _emit(
        args,
        {**record_json(rec), "dest": dest},
        f"{dest}: {rec.size} bytes, verified ({args.verify})",
    )
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """The strategy a store uses (or would use) and whether it exists; creates nothing. A store
    that does not exist is a usage error (exit 2), its strategy still shown."""
    store = _open(args, args.url, existing=False)
    info = {**store.describe(), "exists": store.backend.root_exists()}
    text = "\n".join(f"{k}: {v}" for k, v in info.items())
    _emit(args, info, text)
    if not info["exists"]:
        missing = NotFoundError(
            f"no store at {store.url} (nothing was created; the first write creates it)"
        )
        return _fail(bool(args.json), missing, EXIT_USAGE)
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


_JSON_ERRORS: contextvars.ContextVar[bool] = contextvars.ContextVar("json_errors", default=False)
"""Set by :func:`main` when the command line has ``--json``: usage errors are JSON too."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as a JSON object on stderr under ``--json`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        if not _JSON_ERRORS.get():
            super().error(message)
        _stderr_json(_error_doc("UsageError", f"{self.prog}: {message}", EXIT_USAGE))
        self.exit(EXIT_USAGE)


def _stderr_json(doc: Any) -> None:
    print(json.dumps(doc, ensure_ascii=False), file=sys.stderr, flush=True)


def _error_doc(kind: str, message: str, code: int, exc: BaseException | None = None) -> Any:
    """``{"error": {...}}``: the error's type and message, the exit status, and its ``errno``
    and integrity ``status`` where it has them."""
    doc: dict[str, Any] = {"type": kind, "message": message, "exit_code": code}
    if isinstance(exc, OSError) and exc.errno is not None:
        doc["errno"] = errno.errorcode.get(exc.errno, exc.errno)
    status = getattr(exc, "status", None)
    if isinstance(status, str):
        doc["status"] = status
    return {"error": doc}


class _JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"log": {"level": record.levelname.lower(), "message": record.getMessage()}}
        return json.dumps(doc, ensure_ascii=False)


def _fail(as_json: bool, exc: BaseException, code: int) -> int:
    """Print ``exc`` as the command's error (one line: text, or a JSON object) and return
    ``code``."""
    if as_json:
        _stderr_json(_error_doc(type(exc).__name__, str(exc), code, exc))
    else:
        print(f"commitstore: error: {exc}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="commitstore", description=__doc__.splitlines()[0])
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
    sp = add("info", "which commit strategy a store uses, and why; exit 2 if it does not exist")
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
    """Entry point; returns the exit status (also used by ``python -m commitstore``).

    Usage errors exit 2 (``SystemExit``, as argparse does); with ``--json`` they, every error
    and every log line are JSON objects on stderr (see the module docstring). An unexpected
    exception is a traceback without ``--json``, and under it a JSON error with
    ``"internal": true`` (exit 1), so stderr stays machine-readable."""
    argv = list(sys.argv[1:] if argv is None else argv)
    token = _JSON_ERRORS.set("--json" in argv)
    try:
        args = build_parser().parse_args(argv)
    finally:
        _JSON_ERRORS.reset(token)
    as_json = bool(getattr(args, "json", False))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonLogFormatter()
        if as_json
        else logging.Formatter("commitstore: %(levelname)s: %(message)s")
    )
    logger = logging.getLogger("commitstore")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
        return code
    except StorageError as exc:  # a storage state, even one that is also a name error
        return _fail(as_json, exc, EXIT_FAIL)
    except (InvalidNameError, ConfigurationError) as exc:
        return _fail(as_json, exc, EXIT_USAGE)
    except (CommitStoreError, OSError) as exc:
        return _fail(as_json, exc, EXIT_FAIL)
    except KeyboardInterrupt:
        if as_json:
            _stderr_json(_error_doc("KeyboardInterrupt", "interrupted", 130))
        else:
            print("commitstore: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not as_json:
            raise
        doc = _error_doc(type(exc).__name__, str(exc), EXIT_FAIL, exc)
        doc["error"]["internal"] = True
        _stderr_json(doc)
        return EXIT_FAIL
    finally:
        logger.removeHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
