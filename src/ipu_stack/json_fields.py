"""Typed fields of the JSON files ipu-stack reads (package manifests, snapshots, schedules).

JSON has one number type; Python's ``json`` gives ``int``, ``float`` or ``bool`` (a subclass
of ``int``). These readers take exactly what the format says: an integer field rejects
``340.5``, ``"340"`` and ``true``; every field has a range. Each failure is a
:class:`~ipu_stack.errors.PackageError` (exit status 2) naming where and what.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ipu_stack.errors import PackageError
from ipu_stack.exchange.model import ExchangeModel

#: Largest integer any field of our files may hold (int64, what the package tables store).
INT64_MAX = 2**63 - 1
LATENCIES = ("time_to_mux", "none")
MODEL_SWITCHES = ("paired", "dependencies", "sram_hazards", "full_duplex")


def field(mapping: Mapping[str, Any], key: str, where: str) -> Any:
    """``mapping[key]``, or one line naming the missing key."""
    if not isinstance(mapping, Mapping):
        raise PackageError(f"{where}: expected an object, got {type(mapping).__name__}")
    if key not in mapping:
        raise PackageError(f"{where}: missing key {key!r}")
    return mapping[key]


def integer(value: Any, what: str, low: int = 0, high: int = INT64_MAX) -> int:
    """A JSON integer (not a bool, float or string) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PackageError(f"{what} must be an integer, got {value!r:.40}")
    if not low <= value <= high:
        raise PackageError(f"{what} must be in {low}..{high}, got {value}")
    return value


def int_field(
    mapping: Mapping[str, Any], key: str, where: str, low: int = 0, high: int = INT64_MAX
) -> int:
    """An integer field of an object, in ``[low, high]``."""
    return integer(field(mapping, key, where), f"{where}: {key!r}", low, high)


def str_field(
    mapping: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...] | None = None
) -> str:
    """A string field, optionally one of ``choices``."""
    value = field(mapping, key, where)
    if not isinstance(value, str):
        raise PackageError(f"{where}: {key!r} must be a string, got {value!r:.40}")
    if choices is not None and value not in choices:
        raise PackageError(f"{where}: {key!r} is {value!r:.40}, expected one of {choices}")
    return value


def list_field(mapping: Mapping[str, Any], key: str, where: str, nonempty: bool = False) -> list:
    """A list field (optionally non-empty)."""
    value = field(mapping, key, where)
    if not isinstance(value, list):
        raise PackageError(f"{where}: {key!r} must be a list, got {type(value).__name__}")
    if nonempty and not value:
        raise PackageError(f"{where}: {key!r} is empty")
    return value


def bool_field(mapping: Mapping[str, Any], key: str, where: str) -> bool:
    """A JSON ``true``/``false`` field."""
    value = field(mapping, key, where)
    if not isinstance(value, bool):
        raise PackageError(f"{where}: {key!r} must be true or false, got {value!r:.40}")
    return value


def model_from_json(value: Any, where: str) -> ExchangeModel:
    """An :class:`ExchangeModel` from its ``as_dict`` form: exactly its keys, typed."""
    if not isinstance(value, Mapping):
        raise PackageError(f"{where}: 'model' must be an object")
    unknown = sorted(set(value) - {"latency", *MODEL_SWITCHES})
    if unknown:
        raise PackageError(f"{where}: model has unknown key {unknown[0]!r}")
    return ExchangeModel(
        latency=str_field(value, "latency", f"{where} model", LATENCIES),
        **{name: bool_field(value, name, f"{where} model") for name in MODEL_SWITCHES},
    )
