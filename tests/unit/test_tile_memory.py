"""``heap_kept``: glibc's thresholds raised for the block, restored (and the kept heap
trimmed) once, at the outermost exit; without glibc nothing is called."""

from __future__ import annotations

import pytest

from ipu_stack.runtime import tile_memory


def test_heap_kept_sets_restores_and_nests(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(
        tile_memory,
        "_glibc",
        lambda: (lambda p, v: calls.append(("mallopt", p, v)) or 1,
                 lambda pad: calls.append(("trim", pad)) or 1),
    )  # fmt: skip
    with tile_memory.heap_kept():
        with tile_memory.heap_kept():
            inner = list(calls)
        assert calls == inner
    assert calls == [
        ("mallopt", -3, tile_memory.HEAP_BELOW),
        ("mallopt", -1, tile_memory.KEEP_FREE),
        ("mallopt", -1, 128 * 1024),
        ("mallopt", -3, 128 * 1024),
        ("trim", 0),
    ]
    assert tile_memory._kept == [0]


def test_heap_kept_restores_after_an_error_and_without_glibc(monkeypatch):
    with pytest.raises(ValueError), tile_memory.heap_kept():
        raise ValueError("inside")
    assert tile_memory._kept == [0]
    monkeypatch.setattr(tile_memory, "_glibc", lambda: None)
    with tile_memory.heap_kept():
        pass
    assert tile_memory._kept == [0]
