"""One module-scoped fixture per test server: started once for the test file, stopped by PID at
its end (every server helper here has ``Server(base_dir, **options)`` and ``stop()``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest


class _Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Stoppable)


def module_server(make: Callable[..., S], name: str, **options: Any) -> Any:
    """A fixture called ``name`` that yields ``make(<a fresh temp folder>, **options)`` for the
    whole module and stops it afterwards, whatever the tests did."""

    @pytest.fixture(scope="module", name=name)
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S]:
        base: Path = tmp_path_factory.mktemp(name)
        server = make(base, **options)
        try:
            yield server
        finally:
            server.stop()

    return fixture
