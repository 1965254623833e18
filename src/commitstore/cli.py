"""commitstore command line: safe checkpoint and artifact writes, checks and copies.

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
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from commitstore import __version__
from commitstore._cli_commands import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    cmd_adopt,
    cmd_demo,
    cmd_gc,
    cmd_get,
    cmd_info,
    cmd_latest,
    cmd_ls,
    cmd_prune,
    cmd_put,
    cmd_restore,
    cmd_rm,
    cmd_sync,
    cmd_verify,
    record_json,
)
from commitstore._cli_log import error_doc, exit_code_of, fail, logging_for, stderr_json
from commitstore._cli_scrub import DESCRIPTION as SCRUB_DESCRIPTION
from commitstore._cli_scrub import HELP as SCRUB_HELP
from commitstore._cli_scrub import add_arguments as scrub_arguments

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "build_parser", "main", "record_json"]

TITLE = __doc__.splitlines()[0].replace("``", "")
"""The first docstring line, as plain text (no reStructuredText markup)."""

EPILOG = """\
exit status:
  0    all good
  1    an integrity problem was found, or an operation failed (one line on stderr)
  2    usage error: a bad argument, option or name, or a store that does not exist
       (for every command but put and restore; nothing is created)
  130  interrupted

Storage options: -o KEY=VALUE goes to the primary (the first URL), -O KEY=VALUE to every
mirror; -o URL_PREFIX:KEY=VALUE (or -O) to every URL that starts with URL_PREFIX. SMB
passwords come from COMMITSTORE_SMB_PASSWORD, cloud credentials from each SDK's usual
environment and files.
"""

_JSON_ERRORS: contextvars.ContextVar[bool] = contextvars.ContextVar("json_errors", default=False)
"""Set by :func:`main` when the command line has ``--json``: usage errors are JSON too."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as a JSON object on stderr under ``--json`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        if not _JSON_ERRORS.get():
            super().error(message)
        stderr_json(error_doc("UsageError", f"{self.prog}: {message}", EXIT_USAGE))
        self.exit(EXIT_USAGE)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and the epilog as written; each option's default, when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" not in text
            and default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
            and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text


def _common() -> _Parser:
    """The options every command takes."""
    p = _Parser(add_help=False)
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output: one JSON document on stdout, one JSON object per line "
        "on stderr",
    )
    p.add_argument(
        "--mirror",
        action="append",
        metavar="URL",
        help="a mirror: every commit of the command reaches it before the command returns "
        "(repeatable)",
    )
    p.add_argument(
        "-o",
        "--option",
        action="append",
        metavar="[URL_PREFIX:]KEY=VALUE",
        help="storage option for the primary, e.g. strategy=bridge, readback=false, port=1445, "
        "endpoint_url=http://...; with URL_PREFIX: for every URL starting with it (repeatable)",
    )
    p.add_argument(
        "-O",
        "--mirror-option",
        action="append",
        metavar="[URL_PREFIX:]KEY=VALUE",
        help="storage option for every mirror (sync's MIRROR..., restore --from, --mirror), "
        "like aws s3's --endpoint-url for the remote side; with URL_PREFIX: for the URLs "
        "starting with it (repeatable)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="draw a progress bar on stderr for any copy (by default: only on a terminal, "
        "for copies of 32 MiB or more; never with --json)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="-v: also log each commit, copy and deletion; -vv: debug, with third-party "
        "warnings and tracebacks (default: warnings and deletions)",
    )
    p.add_argument("-q", "--quiet", action="count", default=0, help="log errors only (no warnings)")
    return p


_URL = "store URL: a local path, file://, smb://, s3://, gs://, az://, or any fsspec URL"
_LEVEL = "size: compare sizes with the record; full: sizes, then the xxh3_128 digest"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="commitstore",
        description=TITLE,
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    p.add_argument("--version", action="version", version=f"commitstore {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()

    def add(name: str, help_: str, description: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help_,
            description="\n\n".join(
                textwrap.fill(t, 88) for t in (f"commitstore {name}: {help_}.", description) if t
            ),
            epilog=EPILOG,
            parents=[common],
            formatter_class=_Formatter,
        )

    sp = add(
        "ls",
        "list committed artifacts, oldest to newest",
        "Columns: step, size in bytes, commit time (UTC), digest, name, and 'alias' for a "
        "moving name (never pruned). Bad records are listed as bad_record rows.",
    )
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.set_defaults(func=cmd_ls)
    sp = add("verify", "check artifacts against their records; exit 1 on any problem")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("name", metavar="NAME", nargs="?", help="one artifact (default: all)")
    sp.add_argument("--level", choices=("size", "full"), default="full", help=_LEVEL)
    sp.set_defaults(func=cmd_verify)
    sp = add("latest", "the newest artifact that verifies; exit 1 if there is none")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("--level", choices=("size", "full"), default="full", help=_LEVEL)
    sp.set_defaults(func=cmd_latest)
    sp = add(
        "put",
        "commit a local file or folder as one artifact",
        "Prints the record with bytes, seconds and MB/s; the store is created by its first write.",
    )
    sp.add_argument("local", metavar="LOCAL", help="local file, or folder (one folder artifact)")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("--name", help="artifact name (default: LOCAL's base name)")
    sp.add_argument("--step", type=int, help="training step (default: read from the name)")
    sp.add_argument("--overwrite", action="store_true", help="replace a committed NAME atomically")
    sp.set_defaults(func=cmd_put)
    sp = add("get", "copy an artifact out, verified")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("name", metavar="NAME", help="artifact name")
    sp.add_argument(
        "dest",
        metavar="DEST",
        help="local path; an existing folder receives the artifact inside it under its base "
        "name (as cp); a local folder is never replaced, nor a file by a folder artifact",
    )
    sp.add_argument(
        "--verify",
        choices=("size", "full", "none"),
        default="full",
        help=_LEVEL + "; none: no check",
    )
    sp.set_defaults(func=cmd_get)
    sp = add(
        "rm",
        "delete committed artifacts, record first, then data",
        "A folder path holding other committed artifacts is refused (exit 1), nothing "
        "removed. Every NAME is checked before anything is deleted; a failed one does not "
        "stop the others. Deletes on URL only: run rm on a mirror's URL for its copy.",
    )
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("names", metavar="NAME", nargs="+", help="artifact names")
    sp.add_argument(
        "--dry-run", action="store_true", help="say what would be deleted, delete nothing"
    )
    sp.set_defaults(func=cmd_rm)
    sp = add(
        "restore",
        "copy a verified mirror copy of an artifact back to the primary",
        "Copies only where nothing is lost: the primary's copy is missing or fails its "
        "check, or is the same version. The mirror's options go with -O.",
    )
    sp.add_argument("url", metavar="URL", help="the primary's " + _URL)
    sp.add_argument("name", metavar="NAME", help="artifact name")
    sp.add_argument(
        "--from",
        dest="source",
        action="append",
        metavar="MIRROR",
        help="mirror URL to copy from (repeatable: the first with a whole copy; --mirror URLs "
        "are tried after)",
    )
    sp.add_argument(
        "--overwrite",
        action="store_true",
        help="also replace a different primary version that verifies",
    )
    sp.set_defaults(func=cmd_restore)
    sp = add("info", "which commit strategy a store uses, and why; exit 2 if it does not exist")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.set_defaults(func=cmd_info)
    sp = add("gc", "remove staging files and unfinished uploads left by dead writers")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("--min-age", type=float, default=3600, help="only what is older, in seconds")
    sp.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    sp.set_defaults(func=cmd_gc)
    sp = add(
        "prune",
        "delete committed artifacts outside the keep-set (guarded)",
        "Never deletes the newest artifact that verifies, anything younger than --min-age, "
        "or anything of unknown age; with --mirror the keep-set is computed over every "
        "target. Deletions are logged as warnings.",
    )
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("--keep-last", type=int, required=True, help="keep the newest N (required)")
    sp.add_argument("--keep-every", type=int, help="also keep every K-th step")
    sp.add_argument(
        "--min-age", type=float, default=300, help="never delete anything younger, in seconds"
    )
    sp.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    sp.set_defaults(func=cmd_prune)
    sp = add("adopt", "write records for whole checkpoints that have none; exit 1 on truncated")
    sp.add_argument("url", metavar="URL", help=_URL)
    sp.add_argument("name", metavar="NAME", nargs="?", help="one file or folder (default: all)")
    sp.add_argument("--trust", action="store_true", help="adopt unknown formats too")
    sp.set_defaults(func=cmd_adopt)
    sp = add(
        "sync",
        "copy to mirrors what they lack, repair what fails verification",
        "Never deletes on a mirror. Options of the mirrors go with -O (e.g. "
        "-O endpoint_url=http://127.0.0.1:9000 for an S3 mirror), or -o "
        "URL_PREFIX:KEY=VALUE.",
    )
    sp.add_argument("primary", metavar="PRIMARY", help="the primary's " + _URL)
    sp.add_argument("mirrors", metavar="MIRROR", nargs="+", help="mirror URLs")
    sp.add_argument(
        "--no-repair", action="store_true", help="report bad mirror copies, replace nothing"
    )
    sp.set_defaults(func=cmd_sync)
    scrub_arguments(add("scrub", SCRUB_HELP, SCRUB_DESCRIPTION), _URL)
    sp = add("demo", "simulated training run: crash, resume, corruption caught")
    sp.add_argument(
        "dir", metavar="DIR", nargs="?", default="commitstore-demo", help="folder to run it in"
    )
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
    with logging_for(args.verbose - args.quiet, as_json):
        return _run(args, as_json)


def _run(args: Any, as_json: bool) -> int:
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        if as_json:
            stderr_json(error_doc("KeyboardInterrupt", "interrupted", 130))
        else:
            print("commitstore: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        mapped = exit_code_of(exc)
        if mapped is not None:
            return fail(as_json, exc, mapped)
        if not as_json:
            raise
        doc = error_doc(type(exc).__name__, str(exc), EXIT_FAIL, exc)
        doc["error"]["internal"] = True
        stderr_json(doc)
        return EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
