"""``decode_rows`` (kind by top-byte table, fields per kind) against its former form (every
field on every word) and the scalar decoder, on random words, row-like words and
``sendpicp`` prefixes in every position."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from ipu_stack.tilecode.decode import ROW_KINDS, RowArrays, decode, decode_rows

ROW_CODE = {name: i for i, name in enumerate(ROW_KINDS)}


def _reference_decode_rows(words: npt.NDArray[np.uint32] | npt.NDArray[np.int64]) -> RowArrays:
    """The former decoder: every field computed on every word with ``np.where``."""
    w = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    kind = np.full(w.shape, ROW_CODE["other"], np.int64)
    zero = np.zeros(w.shape, np.int64)
    events, sel, value, items, address, sctl = (zero.copy() for _ in range(6))
    is_delay = (w & 0xFFF80000) == 0x40A00000
    is_pic = (w & 0xFC000000) == 0x60000000
    is_xpic = (w & 0xFC000000) == 0x64000000
    is_send = (w & 0xF8000000) == 0x78000000
    is_br = (w & 0xFF0FFFFF) == 0x43000000
    kind[is_delay], kind[is_pic], kind[is_xpic] = 1, 2, 3
    kind[is_send], kind[is_br] = 4, 5
    events = np.where(is_delay, (w & 0x7FFFF) + 1, events)
    events = np.where(is_pic, ((w >> 19) & 0x7F) + 1, events)
    events = np.where(is_xpic, ((w >> 14) & 0xFFF) + 1, events)
    sel = np.where(is_pic, (w >> 18) & 1, np.where(is_xpic, (w >> 13) & 1, 0))
    value = np.where(is_pic, w & 0x3FFFF, np.where(is_xpic, w & 0x1FFF, 0))
    items = np.where(is_send, ((w >> 21) & 0x3F) + 1, 0)
    address = np.where(is_send, (w >> 3) & 0x3FFFF, 0)
    sctl = np.where(is_send, w & 7, 0)
    reg = np.where(is_br, (w >> 20) & 0xF, -1)
    xpic, pic = zero.copy(), zero.copy()
    prefix = np.flatnonzero((w & 0xF0000000) == 0xF0000000)
    last = -2
    for i in prefix.tolist():  # a prefix's second word is data, whatever its bits
        if i == last + 1 or i + 1 >= len(w):
            continue
        last = i
        kind[i], kind[i + 1] = 7, 8
        events[i + 1] = value[i + 1] = sel[i + 1] = items[i + 1] = 0
        address[i + 1] = sctl[i + 1] = 0
        reg[i + 1] = -1
        items[i] = ((w[i] >> 21) & 0x3F) + 1
        address[i], sctl[i], sel[i] = (w[i] >> 3) & 0x3FFFF, w[i] & 7, (w[i] >> 27) & 1
        xpic[i], pic[i] = w[i + 1] >> 18, w[i + 1] & 0x3FFFF
    return RowArrays(kind, events, sel, value, items, address, sctl, reg, xpic, pic)


def _words(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    tops = np.array([0x40, 0x43, 0x60, 0x63, 0x64, 0x67, 0x78, 0x7F, 0xF0, 0xFF, 0x41, 0x70],
                    np.uint32)  # fmt: skip
    biased = rng.random(n) < 0.7
    words[biased] = (words[biased] & 0x00FFFFFF) | (rng.choice(tops, int(biased.sum())) << 24)
    exact = rng.random(n) < 0.1  # exact delay / br forms, with random low fields
    words[exact] = np.where(
        rng.random(int(exact.sum())) < 0.5,
        0x40A00000 | (words[exact] & 0x7FFFF),
        0x43000000 | (words[exact] & 0x00F00000),
    )
    return words


@pytest.mark.parametrize("seed", range(6))
def test_decode_rows_equals_the_former_decoder(seed):
    words = _words(seed, 5000 + 37 * seed)
    if seed % 2:
        words[:3] = 0xF0000000  # prefixes back to back, and one as the last word
        words[-1] = 0xF1234567
    new, old = decode_rows(words), _reference_decode_rows(words)
    for name in RowArrays.__slots__:
        a, b = getattr(new, name), getattr(old, name)
        assert a.dtype == np.int64 and np.array_equal(a, b), name
    # int64 input (the exchange body is uint32; other callers pass int64)
    again = decode_rows(words.astype(np.int64))
    assert all(np.array_equal(getattr(again, n), getattr(new, n)) for n in RowArrays.__slots__)


def test_decode_rows_kinds_match_the_scalar_decoder():
    words = _words(99, 3000)
    words = words[(words >> 28) != 0xF]  # no prefixes: each word stands alone
    rows = decode_rows(words)
    for word, kind in zip(words.tolist(), rows.kind.tolist(), strict=True):
        name = decode(word).mnemonic
        expected = name if name in ROW_KINDS and name != "unknown" else "other"
        assert ROW_KINDS[kind] == expected, hex(word)
