"""The encoder: one instruction (mnemonic and field values) to its 32-bit word."""

from __future__ import annotations

from ipu_stack.errors import IpuStackError
from ipu_stack.tilecode.isa_table import FORMS, SIGNED_FIELDS


class EncodeError(IpuStackError):
    """A field value does not fit its instruction's field (never encoded wrongly)."""


def encode(mnemonic: str, **values: int) -> int:
    """The word of ``mnemonic`` with ``values`` (every field of its form, by name).

    Raises:
        EncodeError: unknown mnemonic, a missing or unknown field, or a value out of range.
    """
    form = FORMS.get(mnemonic)
    if form is None:
        raise EncodeError(f"no instruction {mnemonic!r}")
    names = {name for name, _, _ in form.fields}
    extra = set(values) - names
    if extra:
        raise EncodeError(f"{mnemonic}: unknown field {sorted(extra)[0]!r}")
    word = form.opcode
    for name, shift, width in form.fields:
        if name not in values:
            raise EncodeError(f"{mnemonic}: field {name!r} missing")
        value = int(values[name])
        if (mnemonic, name) in SIGNED_FIELDS:
            lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
        else:
            lo, hi = 0, (1 << width) - 1
        if not lo <= value <= hi:
            raise EncodeError(f"{mnemonic}: {name}={value} outside {lo}..{hi}")
        word |= (value & ((1 << width) - 1)) << shift
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
