"""The error an integration module raises when its extra is not installed: the same pip hint a
backend gives for a missing extra (``backends/__init__.py``), never a bare ModuleNotFoundError."""

from __future__ import annotations

from commitstore.errors import ConfigurationError


class MissingExtraError(ConfigurationError, ImportError):
    """An optional dependency of an integration module is not installed. Also an
    ``ImportError``, so ``except ImportError`` around an optional import still catches it; the
    message names the extra and the pip command."""


def missing_extra(module: str, extra: str, exc: ModuleNotFoundError) -> MissingExtraError:
    """The error for ``import commitstore.<module>`` failing on ``exc`` (raise it ``from exc``)."""
    return MissingExtraError(
        f"commitstore.{module} needs the {extra} extra ({exc.name or 'a dependency'} is not "
        f"installed): pip install 'commitstore[{extra}]'"
    )
