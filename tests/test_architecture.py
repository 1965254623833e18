"""The architecture, pinned: the import graph of ``src/commitstore`` read from the code (every
import, type-only and function-level ones included).

- no import cycle between modules, except the ones listed in ``KNOWN_CYCLES`` (to be removed);
- integrations, the CLI and the demo import only public names of commitstore (no ``_private``
  module), except the reach-ins listed in ``KNOWN_REACH_INS`` (to be removed), and touch no
  private attribute of the store facade (``store._backend``, ``store._committer``, ...);
- the core (modules outside ``backends/``) imports no concrete backend module (only
  ``commitstore.backends`` itself: the registry and the base classes), except ``KNOWN_CONCRETE``;
- every module of ``src/`` is named in ``docs/backends.md``.

Each rule is also run against a planted violation, so a rule that cannot fail is caught.
The known lists may only shrink: an entry that no longer occurs fails the test too.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PKG = "commitstore"

INTEGRATIONS = (
    "commitstore.torch",
    "commitstore.dcp",
    "commitstore.lightning",
    "commitstore.hf",
    "commitstore.fsspec",
    "commitstore.cli",
    "commitstore.demo",
)
"""Modules that must use commitstore only through its public names (their own private helper
modules, ``commitstore._cli*``, count as part of them)."""

KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_REACH_INS: set[tuple[str, str]] = set()
KNOWN_CONCRETE: set[tuple[str, str]] = set()
HELPERS = {
    "commitstore._snapshot": "commitstore.torch",
    "commitstore._fsview": "commitstore.fsspec",
}
"""Private modules that belong to one integration (its own helpers, not a reach-in)."""


def module_name(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: Path = SRC) -> dict[str, Path]:
    return {module_name(p, src): p for p in sorted((src / PKG).rglob("*.py"))}


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The commitstore modules ``name`` imports (a ``from X import Y`` where ``X.Y`` is a module
    counts as importing ``X.Y``)."""
    known = set(known)
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PKG:
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_pkg, node)
            if base.split(".")[0] != PKG:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def graph(src: Path = SRC) -> dict[str, set[str]]:
    mods = modules(src)
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


def _private(module: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in module.split(".")[1:])


def _owner(module: str) -> str | None:
    """The integration ``module`` belongs to (``commitstore._cli_x`` belongs to the CLI)."""
    for top in INTEGRATIONS:
        if module == top:
            return top
    if module.startswith("commitstore._cli"):
        return "commitstore.cli"
    return HELPERS.get(module)


def reach_ins(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    out = set()
    for mod, deps in g.items():
        if _owner(mod) is None:
            continue
        for dep in deps:
            if _private(dep) and _owner(dep) != _owner(mod):
                out.add((mod, dep))
    return out


FACADE = ("store.py", "_storebase.py", "_storereads.py", "_storeupkeep.py")
"""The modules of :class:`~commitstore.CommitStore` and its method groups."""


def facade_private(src: Path = SRC) -> set[str]:
    """The private attributes of the store facade: declared in its classes' bodies or assigned
    as ``self._x`` in their methods (dunders excepted)."""
    out: set[str] = set()
    for leaf in FACADE:
        path = src / PKG / leaf
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                out.add(node.attr)
    return {a for a in out if a.startswith("_") and not a.startswith("__")}


def attribute_reach_ins(src: Path = SRC) -> set[tuple[str, str]]:
    """(integration module, attribute): a private attribute of the store facade read or set on
    anything but ``self`` by an integration, the CLI or the demo."""
    private = facade_private(src)
    out = set()
    for mod, path in modules(src).items():
        if _owner(mod) is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                out.add((mod, node.attr))
    return out


def _concrete(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 2 and parts[1] == "backends"


def concrete_uses(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Core modules (not under ``backends/``, not ``testing/``) importing a concrete backend."""
    out = set()
    for mod, deps in g.items():
        parts = mod.split(".")
        if len(parts) > 1 and parts[1] in ("backends", "testing"):
            continue
        out |= {(mod, d) for d in deps if _concrete(d)}
    return out


def undocumented(mods: Iterable[str], doc: str) -> list[str]:
    """Modules whose file (``name.py``, or ``name/`` for a package) the page never names."""
    missing = []
    for name in sorted(mods):
        leaf = name.split(".")[-1]
        is_pkg = (SRC / name.replace(".", "/") / "__init__.py").exists()
        if (f"{leaf}/" if is_pkg else f"{leaf}.py") not in doc:
            missing.append(name)
    return missing


# -- the rules, on the real tree -------------------------------------------------------------


def test_no_import_cycle_beyond_the_known_ones() -> None:
    found = cycles(graph())
    assert found - KNOWN_CYCLES == set(), "new import cycles"
    assert KNOWN_CYCLES - found == set(), "a known cycle is gone: remove it from KNOWN_CYCLES"


def test_integrations_import_only_public_names() -> None:
    found = reach_ins(graph())
    assert found - KNOWN_REACH_INS == set(), "integrations reach into private modules"
    assert KNOWN_REACH_INS - found == set(), "a known reach-in is gone: remove it from the list"


def test_integrations_touch_no_private_attribute_of_the_store() -> None:
    assert facade_private() >= {"_backend", "_committer", "_replicator"}
    assert attribute_reach_ins() == set(), "integrations reach into the store's private state"


def test_the_core_names_no_concrete_backend() -> None:
    found = concrete_uses(graph())
    assert found - KNOWN_CONCRETE == set(), "core modules import concrete backends"
    assert KNOWN_CONCRETE - found == set(), "a known use is gone: remove it from the list"


def test_every_module_is_in_the_backends_page() -> None:
    doc = (ROOT / "docs" / "backends.md").read_text()
    assert undocumented(modules(), doc) == []
    spec = importlib.util.spec_from_file_location("docs_layout", ROOT / "docs" / "layout.py")
    assert spec is not None and spec.loader is not None
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    assert not layout.stale(doc), "docs/backends.md's layout block is stale: python docs/layout.py"


# -- each rule catches a planted violation ----------------------------------------------------


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for rel, text in files.items():
        p = src / PKG / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return src


def test_a_planted_type_only_cycle_is_found(tmp_path: Path) -> None:
    src = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from commitstore.b import B\n"
            ),
            "b.py": "from commitstore import a\n",
            "c.py": "from . import a\n",
        },
    )
    assert cycles(graph(src)) == {frozenset({"commitstore.a", "commitstore.b"})}


def test_a_planted_private_import_is_found(tmp_path: Path) -> None:
    src = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "_read.py": "",
            "_cli_x.py": "",
            "torch.py": "def f():\n    from commitstore._read import x\n",
            "cli.py": "from commitstore import _cli_x\n",
        },
    )
    assert reach_ins(graph(src)) == {("commitstore.torch", "commitstore._read")}


def test_a_planted_private_attribute_reach_in_is_found(tmp_path: Path) -> None:
    src = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "store.py": (
                "class CommitStore:\n"
                "    _mirrors: list[int]\n"
                "    def __init__(self):\n"
                "        self._backend = 1\n"
                "        self.url = ''\n"
            ),
            "torch.py": "def f(store):\n    return store._backend, store.url\n",
            "_cli_x.py": "def g(s):\n    s._mirrors.append(1)\n",
            "_write.py": "def h(store):\n    return store._backend\n",
            "hf.py": "class C:\n    def m(self):\n        return self._backend\n",
        },
    )
    assert attribute_reach_ins(src) == {
        ("commitstore.torch", "_backend"),
        ("commitstore._cli_x", "_mirrors"),
    }


def test_a_planted_concrete_backend_import_is_found(tmp_path: Path) -> None:
    src = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "backends/__init__.py": "",
            "backends/rename/__init__.py": "",
            "backends/rename/posix.py": "",
            "store.py": "from commitstore.backends import rename\nimport commitstore.backends\n",
        },
    )
    assert concrete_uses(graph(src)) == {("commitstore.store", "commitstore.backends.rename")}


@pytest.mark.parametrize("doc", ["", "`_read.py` and `store.py`"])
def test_an_undocumented_module_is_found(doc: str) -> None:
    got = undocumented(["commitstore._read", "commitstore.store", "commitstore._new"], doc)
    assert "commitstore._new" in got
    assert ("commitstore._read" in got) == (doc == "")
