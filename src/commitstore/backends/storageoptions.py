"""The checking of a backend factory's storage options (:func:`take_options`): every option
named, every value of its kind or among its choices, before any I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from commitstore.errors import ConfigurationError

Kinds = tuple[type | None, ...]
"""The types an option accepts (``None``: the value None); ``bool`` is never an ``int`` here."""


def _one_of(values: tuple[Any, ...]) -> str:
    """``'a', 'b' or 'c'``: the values an option may take, as the error says them."""
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def take_options(
    options: dict[str, Any],
    defaults: dict[str, Any],
    *,
    kinds: dict[str, Kinds] | None = None,
    choices: dict[str, tuple[Any, ...]] | None = None,
) -> dict[str, Any]:
    """``defaults`` updated with ``options``, for a backend factory, every value checked.

    Each given option must be of the kind of its default: a bool for a bool (``"maybe"``, 1
    or None are refused), an integer (not a bool) for an integer, a finite number (not a bool)
    for a float, a string for a string, a mapping for a mapping; ``kinds`` overrides that (and
    gives the kinds of options whose default is None: those are otherwise free, as credentials
    are). An option in ``choices`` must be one of its values.

    Raises:
        ConfigurationError: an option ``defaults`` does not name, or a value of the wrong kind
            or not among its choices, before any I/O.
    """
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ConfigurationError(f"unknown storage options {unknown}; known: {sorted(defaults)}")
    kinds = kinds or {}
    for key, value in options.items():
        allowed = kinds.get(key) or _kinds_of(defaults[key])
        if allowed and not any(_is_kind(value, kind) for kind in allowed):
            names = " or ".join(
                "None" if k is None else _KIND_NAMES.get(k, k.__name__) for k in allowed
            )
            raise ConfigurationError(f"storage option {key} must be {names}, not {value!r}")
        if choices and key in choices and value not in choices[key]:
            raise ConfigurationError(
                f"storage option {key} must be {_one_of(choices[key])}, not {value!r}"
            )
    return {**defaults, **options}


_KIND_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}


def _kinds_of(default: Any) -> Kinds:
    """The kinds an option with this default accepts; () for any."""
    for kind in (bool, int, float, str):
        if type(default) is kind:
            return (kind,)
    if isinstance(default, dict):
        return (dict,)
    return ()


def _is_kind(value: Any, kind: type | None) -> bool:
    if kind is None:
        return value is None
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    if kind is dict:
        return isinstance(value, Mapping)
    return isinstance(value, kind)
