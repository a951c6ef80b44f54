"""Aliased views read back through tile memory equal NumPy's reshape and transpose."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import numpy as np
import pytest

from ipu_stack.low.alias_views import alias_shards
from ipu_stack.low.program import Ref, Shard

EB = 2  # f16: each element holds its own flat index as a uint16


def _source(n: int, c: int, rng: np.random.Generator) -> tuple[list[Shard], dict[str, np.ndarray]]:
    """Random row x column blocks of ``[n, c]``, each at a random word-aligned offset and
    stride of its own buffer; the memory holds element ``i`` as the value ``i``."""
    row_cuts = np.unique(np.concatenate(([0, n], rng.integers(1, n, 3))))
    col_cuts = np.unique(np.concatenate(([0, c], 2 * rng.integers(1, c // 2, 2))))
    values = np.arange(n * c, dtype=np.uint16).reshape(n, c)
    shards, memory = [], {}
    for i, (r0, r1) in enumerate(pairwise(row_cuts)):
        for j, (c0, c1) in enumerate(pairwise(col_cuts)):
            stride = -(-(c1 - c0) * EB // 4) * 4 + 4 * int(rng.integers(0, 3))
            offset = 4 * int(rng.integers(0, 8))
            name = f"b{i}_{j}"
            mem = np.zeros(offset + (r1 - r0) * stride, dtype=np.uint8)
            for r in range(r0, r1):
                at = offset + (r - r0) * stride
                mem[at : at + (c1 - c0) * EB] = values[r, c0:c1].view(np.uint8)
            memory[name] = mem
            shards.append(Shard(i * 10 + j, Ref(name, offset), (r0, r1), (c0, c1), stride))
    return shards, memory


def _read(shards: list[Shard], memory: dict[str, np.ndarray], n: int, c: int) -> np.ndarray:
    """The view ``[n, c]`` as its shards name it; every element exactly once."""
    out = np.full((n, c), -1, dtype=np.int64)
    for sh in shards:
        width = sh.cols[1] - sh.cols[0]
        assert sh.row_stride >= width * EB
        for k, r in enumerate(range(*sh.rows)):
            at = sh.ref.offset + k * sh.row_stride
            got = memory[sh.ref.buffer][at : at + width * EB].view(np.uint16)
            assert (out[r, sh.cols[0] : sh.cols[1]] == -1).all(), "element named twice"
            out[r, sh.cols[0] : sh.cols[1]] = got
    assert (out >= 0).all(), "element not named"
    return out


@pytest.mark.parametrize("seed", range(6))
def test_split_reshape(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c, k = 7, 48, int(rng.choice([2, 3, 4]))
    shards, memory = _source(n, c, rng)
    view = alias_shards(shards, EB, c, c // k, spread=None)
    assert view is not None
    want = np.arange(n * c).reshape(n * k, c // k)
    np.testing.assert_array_equal(_read(view, memory, n * k, c // k), want)


@pytest.mark.parametrize("seed", range(6))
def test_row_permutation_then_merge(seed: int) -> None:
    """[T, H, D] -> [H, T, D] (a transpose keeping the last axis), then back to [T, H*D]."""
    rng = np.random.default_rng(seed)
    t, h, d = 5, 4, 6
    shards, memory = _source(t * h, d, rng)  # the [T*H, D] rows of [T, H, D]
    idx = np.unravel_index(np.arange(t * h), (t, h))
    view_row = np.ravel_multi_index((idx[1], idx[0]), (h, t))
    heads = alias_shards(shards, EB, d, d, view_row, spread=None)
    assert heads is not None
    values = np.arange(t * h * d).reshape(t, h, d)
    want = values.transpose(1, 0, 2).reshape(h * t, d)
    np.testing.assert_array_equal(_read(heads, memory, h * t, d), want)
    # and the heads of [H, T, D] back into rows of [T, H*D]
    back_row = np.ravel_multi_index((idx[0], idx[1]), (t, h))[np.argsort(view_row)]
    rows = alias_shards(heads, EB, d, d, back_row, spread=None)
    assert rows is not None
    merged = alias_shards(rows, EB, d, h * d, spread=None)
    assert merged is not None
    np.testing.assert_array_equal(_read(merged, memory, t, h * d), values.reshape(t, h * d))


def test_split_then_transpose_merges_back_into_blocks() -> None:
    """[T, H*D] -> [T, H, D] -> [H, T, D]: the intermediate is cut per row, the result is
    one shard per (block, head) again."""
    rng = np.random.default_rng(7)
    t, h, d = 9, 4, 8
    shards, memory = _source(t, h * d, rng)
    split = alias_shards(shards, EB, h * d, d, spread=None)
    assert split is not None and len(split) > len(shards)
    idx = np.unravel_index(np.arange(t * h), (t, h))
    heads = alias_shards(split, EB, d, d, np.ravel_multi_index((idx[1], idx[0]), (h, t)))
    assert heads is not None
    assert len(heads) <= 2 * h * len(shards)
    want = np.arange(t * h * d).reshape(t, h, d).transpose(1, 0, 2).reshape(h * t, d)
    np.testing.assert_array_equal(_read(heads, memory, h * t, d), want)


def test_unnameable_cases_give_none() -> None:
    rng = np.random.default_rng(1)
    shards, _ = _source(6, 40, rng)
    assert alias_shards(shards, EB, 40, 12) is None  # widths do not divide
    whole = [Shard(0, Ref("a", 0), (0, 2), (0, 10), 20)]
    assert alias_shards(whole, EB, 10, 5, spread=None) is None  # rows of 5 f16: 10 bytes
    assert alias_shards(whole, EB, 10, 2, spread=None) is not None
    flipped = [dataclasses.replace(shards[0], transposed=True), *shards[1:]]
    assert alias_shards(flipped, EB, 40, 10) is None
    assert alias_shards(shards, EB, 40, 4, spread=1) is None  # too finely cut


def test_the_reader_catches_a_wrong_alias() -> None:
    """A mutation of the alias (one shard's offset moved by a word) is caught."""
    rng = np.random.default_rng(3)
    n, c = 6, 32
    shards, memory = _source(n, c, rng)
    view = alias_shards(shards, EB, c, 8, spread=None)
    assert view is not None
    want = np.arange(n * c).reshape(n * 4, 8)
    np.testing.assert_array_equal(_read(view, memory, n * 4, 8), want)
    bad = [dataclasses.replace(view[1], ref=view[1].ref.at(4)), view[0], *view[2:]]
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(_read(bad, memory, n * 4, 8), want)
