"""The decoder: IPU21 words back to instructions, written from the facts (§9.1, §9.4) alone.

It shares no code and no table with the encoder (``isa_table``/``encode``): each pattern
below is (mask, match, name, field extractors) read independently from the facts, so an
encoder mistake is caught by the round-trip property test instead of being repeated here.
:func:`decode_rows` decodes whole arrays of row words with NumPy (the simulator's path).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_XPIC = (("events_m1", 14, 12), ("sel", 13, 1), ("value", 0, 13))
_PIC = (("events_m1", 19, 7), ("sel", 18, 1), ("value", 0, 18))
_SEND = (("count_m1", 21, 6), ("word_address", 3, 18), ("sctl", 0, 3))
_LD = (("base", 20, 4), ("dst", 16, 4), ("delta", 12, 4), ("off", 0, 12))
_ST = (("base", 20, 4), ("src", 16, 4), ("delta", 12, 4), ("off", 0, 12))
# (mask, match, name, ((field, low bit, bits), ...)); first match wins, most specific first.
_SENDPICP = (("picsel", 27, 1), ("count_m1", 21, 6), ("word_address", 3, 18), ("sctl", 0, 3))
_PATTERNS: tuple[tuple[int, int, str, tuple[tuple[str, int, int], ...]], ...] = (
    (0xF0000000, 0xF0000000, "sendpicp", _SENDPICP),
    (0xFFFFFFFF, 0x40C00000, "sans", ()),
    (0xFFFFF000, 0x41801000, "trap", (("code", 0, 12),)),
    (0xFFFFFFF0, 0x41800000, "sync", (("zone", 0, 4),)),
    (0xFFF80000, 0x40A00000, "delay", (("events_m1", 0, 19),)),
    (0xFF0FFF00, 0x43008000, "put", (("reg", 20, 4), ("csr", 0, 8))),
    (0xFF0FFFFF, 0x43000000, "br", (("reg", 20, 4),)),
    (0xFC000000, 0x64000000, "delayxpic", _XPIC),
    (0xFC000000, 0x60000000, "delaypic", _PIC),
    (0xF8000000, 0x78000000, "send", _SEND),
    (0xF8100000, 0x70100000, "sendpic", (("count_m1", 21, 6), ("sel", 18, 2), ("value", 0, 18))),
    (0xF8100000, 0x70000000, "sendoff",
     (("count_m1", 21, 6), ("count_high", 14, 6), ("delta", 3, 11), ("sctl", 0, 3))),
    (0xFF080000, 0x18000000, "call", (("reg", 20, 4), ("target_words", 0, 19))),
    (0xFF000000, 0x19000000, "setzi", (("reg", 20, 4), ("imm", 0, 20))),
    (0xFF000000, 0x01000000, "ld32", _LD),
    (0xFF000000, 0x4F000000, "st32", _ST),
    (0xFF000000, 0x22000000, "add", (("src", 20, 4), ("dst", 16, 4), ("simm", 0, 16))),
    (0xFF080000, 0x13000000, "brz", (("reg", 20, 4), ("target_words", 0, 19))),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decoded:
    """One decoded word: mnemonic (``"unknown"`` if no pattern matches) and its fields."""

    word: int
    mnemonic: str
    fields: dict[str, int]

    def text(self) -> str:
        """Assembly-like text: ``send count=64 word_address=0x1c000 sctl=1``."""
        if self.mnemonic == "unknown":
            return f".word {self.word:#010x}"
        return " ".join([self.mnemonic] + [f"{k}={_show(k, v)}" for k, v in self.fields.items()])


def _show(name: str, value: int) -> str:
    if name in ("word_address", "value", "imm", "target_words"):
        return hex(value)
    return str(value)


def decode_picword(word: int) -> Decoded:
    """The second word of a ``sendpicp``: ``(xpic14 << 18) | pic18`` (facts §9.1)."""
    word &= 0xFFFFFFFF
    return Decoded(word, "picword", {"xpic": word >> 18, "pic": word & 0x3FFFF})


def decode(word: int) -> Decoded:
    """Decode one 32-bit word (a ``sendpicp``'s second word: :func:`decode_picword`)."""
    word &= 0xFFFFFFFF
    for mask, match, name, fields in _PATTERNS:
        if word & mask == match:
            values = {f: (word >> low) & ((1 << bits) - 1) for f, low, bits in fields}
            if name == "add" and values["simm"] & 0x8000:
                values["simm"] -= 0x10000
            return Decoded(word, name, values)
    return Decoded(word, "unknown", {})


#: row instruction kinds in :func:`decode_rows` output
ROW_KINDS = (
    "unknown",
    "delay",
    "delaypic",
    "delayxpic",
    "send",
    "br",
    "other",
    "sendpicp",
    "picword",
)
_ROW_CODE = {name: i for i, name in enumerate(ROW_KINDS)}


@dataclass(frozen=True, slots=True)
class RowArrays:
    """Vectorised decode of exchange-row words (all ``int64`` arrays of the words' length).

    ``events``: cycles the instruction waits before acting (send: 0); ``sel``/``value``: PIC
    or XPIC selector and value; ``items``, ``address`` (word address), ``sctl`` for sends and
    ``sendpicp``; ``xpic``/``pic``: a ``sendpicp``'s controls (from its second word, whose
    own kind is ``picword``).
    """

    kind: npt.NDArray[np.int64]
    events: npt.NDArray[np.int64]
    sel: npt.NDArray[np.int64]
    value: npt.NDArray[np.int64]
    items: npt.NDArray[np.int64]
    address: npt.NDArray[np.int64]
    sctl: npt.NDArray[np.int64]
    reg: npt.NDArray[np.int64]
    xpic: npt.NDArray[np.int64]
    pic: npt.NDArray[np.int64]


#: row kind by a word's top byte: 0x40 and 0x43 only name candidates (``delay`` and ``br``
#: need more bits), 0xF0.. a ``sendpicp`` prefix (its pairing is settled in order)
_TOP_KIND = np.full(256, _ROW_CODE["other"], np.int8)
_TOP_KIND[0x40], _TOP_KIND[0x43] = -1, -2
_TOP_KIND[0x60:0x64], _TOP_KIND[0x64:0x68] = _ROW_CODE["delaypic"], _ROW_CODE["delayxpic"]
_TOP_KIND[0x78:0x80], _TOP_KIND[0xF0:] = _ROW_CODE["send"], -3


def decode_rows(words: npt.NDArray[np.uint32] | npt.NDArray[np.int64]) -> RowArrays:
    """Decode an array of row words at once (unknown or non-row words get kind ``other``).

    The kind comes from a table of the top byte; each field is computed on the words of the
    kinds that have it (a row phase decodes millions of words; every field on every word
    was ~5 times the work).
    """
    w = (np.asarray(words).astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    kinds = _TOP_KIND[w >> 24]
    # zeroed by the allocator: the pages of a field no word of the phase has are not touched
    events, sel, value, items, address, sctl, xpic, pic = (
        np.zeros(w.shape, np.int64) for _ in range(8)
    )
    reg = np.full(w.shape, -1, np.int64)
    other = _ROW_CODE["other"]
    at = np.flatnonzero(kinds == -1)
    kinds[at] = np.where((w[at] & 0xFFF80000) == 0x40A00000, _ROW_CODE["delay"], other)
    at = np.flatnonzero(kinds == -2)
    is_br = (w[at] & 0xFF0FFFFF) == 0x43000000
    kinds[at] = np.where(is_br, _ROW_CODE["br"], other)
    at = at[is_br]
    reg[at] = (w[at] >> 20) & 0xF
    at = np.flatnonzero(kinds == _ROW_CODE["delay"])
    events[at] = (w[at] & 0x7FFFF) + 1
    at = np.flatnonzero(kinds == _ROW_CODE["delaypic"])
    x = w[at]
    events[at], sel[at], value[at] = ((x >> 19) & 0x7F) + 1, (x >> 18) & 1, x & 0x3FFFF
    at = np.flatnonzero(kinds == _ROW_CODE["delayxpic"])
    x = w[at]
    events[at], sel[at], value[at] = ((x >> 14) & 0xFFF) + 1, (x >> 13) & 1, x & 0x1FFF
    at = np.flatnonzero(kinds == _ROW_CODE["send"])
    x = w[at]
    items[at], address[at], sctl[at] = ((x >> 21) & 0x3F) + 1, (x >> 3) & 0x3FFFF, x & 7
    prefix = np.flatnonzero(kinds == -3)
    kinds[prefix] = other
    kind = kinds.astype(np.int64)
    last = -2
    for i in prefix.tolist():  # a prefix's second word is data, whatever its bits
        if i == last + 1 or i + 1 >= len(w):
            continue
        last = i
        kind[i], kind[i + 1] = 7, 8
        events[i + 1] = value[i + 1] = sel[i + 1] = items[i + 1] = 0
        address[i + 1] = sctl[i + 1] = 0
        reg[i + 1] = -1
        first, second = int(w[i]), int(w[i + 1])
        items[i] = ((first >> 21) & 0x3F) + 1
        address[i], sctl[i], sel[i] = (first >> 3) & 0x3FFFF, first & 7, (first >> 27) & 1
        xpic[i], pic[i] = second >> 18, second & 0x3FFFF
    return RowArrays(kind, events, sel, value, items, address, sctl, reg, xpic, pic)
