#!/usr/bin/env bash
# The project's two entry points (see README):
#   ./dev.sh demo [DIR]   set up and run the main job (local folders, no cloud account)
#   ./dev.sh test [ARGS]  set up and run the full test-suite (starts every server it needs)
# Also: ./dev.sh lint (ruff + mypy --strict), ./dev.sh docs [DIR] (the site, strict, and its
# API reference checked), ./dev.sh bench (benchmarks, not part of tests).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${COMMITSTORE_VENV:-.venv}
PY=${PYTHON:-python3}

# Debian packages the test-suite needs (servers and tools it starts itself; fio for the
# benchmarks' smoke run, tests/test_bench_smoke.py).
SYSTEM_PACKAGES=(util-linux fuse3 libfuse2 samba smbclient gcc libc6-dev fio)
# Debian packages the benchmarks need on top (fio: the local disk's write limit).
BENCH_PACKAGES=("${SYSTEM_PACKAGES[@]}")

need_root_apt() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "dev.sh: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

venv() {
    # "$@": dependency groups of pyproject.toml (PEP 735, development only: test, lint,
    # typecheck, docs, bench), installed with the project (editable). pip >= 25.1 reads them.
    local groups=()
    for group in "$@"; do
        if [ -n "$group" ]; then groups+=(--group "$group"); fi
    done
    if [ ! -x "$VENV/bin/python" ]; then
        if ! "$PY" -m venv "$VENV" 2>/dev/null; then
            need_root_apt python3-venv
            "$PY" -m venv "$VENV"
        fi
    fi
    "$VENV/bin/python" -m pip install -q --upgrade "pip>=25.1" >/dev/null
    if [[ " $* " =~ " "(test|bench)" " ]] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
        # The CPU build first, so that the groups' "torch>=2.1" takes nothing bigger.
        "$VENV/bin/python" -m pip install -q "${COMMITSTORE_TORCH:-torch==2.13.0}"
    fi
    "$VENV/bin/python" -m pip install -q -e . ${groups[@]+"${groups[@]}"}
}

cmd=${1:-}
shift || true
case "$cmd" in
    demo)
        venv
        exec "$VENV/bin/commitstore" demo "$@"
        ;;
    test)
        need_root_apt "${SYSTEM_PACKAGES[@]}"
        if [ ! -x .cache/azurite/node_modules/.bin/azurite-blob ]; then
            command -v npm >/dev/null || need_root_apt npm
            mkdir -p .cache/azurite
            npm install --silent --no-audit --no-fund --prefix .cache/azurite azurite@3
        fi
        venv test
        export COMMITSTORE_REQUIRE_SERVERS=1
        # One worker per core (at most 4); each test file runs whole in one worker, so its
        # module-scoped servers start once. COMMITSTORE_TEST_WORKERS=0 runs in this process.
        workers=${COMMITSTORE_TEST_WORKERS:-$(nproc)}
        [ "$workers" -gt 4 ] && workers=4
        exec "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile "$@"
        ;;
    lint)
        venv test lint typecheck
        "$VENV/bin/ruff" check src tests benchmarks noxfile.py docs
        "$VENV/bin/ruff" format --check src tests benchmarks noxfile.py docs
        "$VENV/bin/python" docs/check_docs.py
        exec "$VENV/bin/mypy"
        ;;
    docs)
        # The site, built as published (strict: any warning fails), then checked: every public
        # name in the rendered API reference. DIR (default: a temporary folder) keeps the site.
        venv docs
        site=${1:-$(mktemp -d)}
        NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs build --strict --site-dir "$site"
        exec "$VENV/bin/python" docs/check_docs.py --reference "$site"
        ;;
    bench)
        need_root_apt "${BENCH_PACKAGES[@]}"
        venv bench
        exec "$VENV/bin/python" -m benchmarks "$@"
        ;;
    *)
        echo "usage: ./dev.sh demo [DIR] | test [PYTEST ARGS] | lint | docs [DIR] | bench [ARGS]" >&2
        exit 2
        ;;
esac
