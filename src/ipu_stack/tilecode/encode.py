"""The encoder: one instruction (mnemonic and field values) to its 32-bit word."""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.errors import IpuStackError
from ipu_stack.tilecode.isa_table import FORMS, SIGNED_FIELDS


class EncodeError(IpuStackError):
    """A field value does not fit its instruction's field (never encoded wrongly)."""


def _ranges() -> dict[str, tuple[int, tuple[tuple[str, int, int, int, int], ...]]]:
    """Per mnemonic: opcode and ``(field, shift, mask, low, high)`` from the one table."""
    out = {}
    for mnemonic, form in FORMS.items():
        fields = []
        for name, shift, width in form.fields:
            if (mnemonic, name) in SIGNED_FIELDS:
                lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
            else:
                lo, hi = 0, (1 << width) - 1
            fields.append((name, shift, (1 << width) - 1, lo, hi))
        out[mnemonic] = (form.opcode, tuple(fields))
    return out


_RANGES = _ranges()


def encode(mnemonic: str, **values: int) -> int:
    """The word of ``mnemonic`` with ``values`` (every field of its form, by name).

    Raises:
        EncodeError: unknown mnemonic, a missing or unknown field, or a value out of range.
    """
    entry = _RANGES.get(mnemonic)
    if entry is None:
        raise EncodeError(f"no instruction {mnemonic!r}")
    word, fields = entry
    if len(values) != len(fields):
        names = {f[0] for f in fields}
        extra = sorted(set(values) - names)
        if extra:
            raise EncodeError(f"{mnemonic}: unknown field {extra[0]!r}")
    for name, shift, mask, lo, hi in fields:
        try:
            value = int(values[name])
        except KeyError:
            raise EncodeError(f"{mnemonic}: field {name!r} missing") from None
        if not lo <= value <= hi:
            raise EncodeError(f"{mnemonic}: {name}={value} outside {lo}..{hi}")
        word |= (value & mask) << shift
    return word


def delay_words(events: int) -> list[int]:
    """``delay`` instructions waiting exactly ``events`` cycles (0 gives none)."""
    out = []
    limit = 1 << 19
    while events > 0:
        step = min(events, limit)
        out.append(encode("delay", events_m1=step - 1))
        events -= step
    return out


def encode_many(mnemonic: str, **values: Any) -> np.ndarray:
    """The words of ``mnemonic`` for arrays of field values (broadcast), as ``int64``.

    The vectorised :func:`encode`: the same table, the same range checks (the first value out
    of range is named), one NumPy bit-field pass over all the words.

    Raises:
        EncodeError: unknown mnemonic, a missing or unknown field, or a value out of range.
    """
    entry = _RANGES.get(mnemonic)
    if entry is None:
        raise EncodeError(f"no instruction {mnemonic!r}")
    opcode, fields = entry
    extra = sorted(set(values) - {f[0] for f in fields})
    if extra:
        raise EncodeError(f"{mnemonic}: unknown field {extra[0]!r}")
    word: np.ndarray = np.asarray(opcode, dtype=np.int64)
    for name, shift, mask, lo, hi in fields:
        if name not in values:
            raise EncodeError(f"{mnemonic}: field {name!r} missing")
        value = np.asarray(values[name], dtype=np.int64)
        bad = (value < lo) | (value > hi)
        if bad.any():
            first = int(value.reshape(-1)[int(np.argmax(bad.reshape(-1)))])
            raise EncodeError(f"{mnemonic}: {name}={first} outside {lo}..{hi}")
        word = word | ((value & mask) << shift)
    return np.asarray(word, dtype=np.int64)
