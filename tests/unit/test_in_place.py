"""``low/in_place.py``: elementwise rows written where their local copies would go."""

from __future__ import annotations

from ipu_stack.low.in_place import write_in_place
from ipu_stack.low.program import (
    Binding,
    Buffer,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    LogicalTransfer,
    MapCall,
    Ref,
    Shard,
    View,
)

ROWS, COLS, EB = 3, 4, 2  # f16 rows of 8 bytes
ROW = COLS * EB


def _program(dst_stride: int = 24, extra: list | None = None, fill: bool = False):
    """A GeLU into A (rows contiguous), then each row copied into B at ``dst_stride``."""
    gelu = MapCall(0, "gelu", View(Ref("A"), ROWS, COLS, ROW, "f16"),
                   (View(Ref("X"), ROWS, COLS, ROW, "f16"),))  # fmt: skip
    copies = [CopyCall(0, Ref("B", i * dst_stride), Ref("A", i * ROW), ROW) for i in range(ROWS)]
    calls = [gelu, *([FillCall(0, Ref("B"), 3 * dst_stride)] if fill else []), *(extra or []),
             *copies]  # fmt: skip
    buffers = [Buffer(0, "X", 64, 8, "any"), Buffer(0, "A", 64, 8, "any", avoid=("X",)),
               Buffer(0, "B", 3 * dst_stride, 8, "any", avoid=("A",))]  # fmt: skip
    return [ComputeStep(calls)], buffers


def test_rows_copied_whole_are_written_in_place_and_the_buffer_dropped():
    steps, buffers = _program()
    kept, removed = write_in_place(steps, buffers, [])
    assert removed == ROWS
    (call,) = steps[0].calls
    assert isinstance(call, MapCall) and call.out == View(Ref("B", 0), ROWS, COLS, 24, "f16")
    assert [b.name for b in kept] == ["X", "B"]
    assert kept[1].avoid == ()  # the dropped buffer leaves no dangling name


def test_zero_fill_of_the_destination_moves_before_the_writer():
    steps, buffers = _program(fill=True)
    write_in_place(steps, buffers, [])
    kinds = [type(c).__name__ for c in steps[0].calls]
    assert kinds == ["FillCall", "MapCall"]


def test_nothing_changes_when_the_rewrite_could_change_a_read():
    # the source is also sent by an exchange
    steps, buffers = _program()
    send = LogicalTransfer(0, Ref("A"), ((1, Ref("C")),), 2)
    steps.append(ExchangeStep("x", [send]))
    assert write_in_place(steps, buffers, [])[1] == 0
    # the source is an output the host reads
    steps, buffers = _program()
    out = Binding("y", "output", "f16", (ROWS, COLS), (Shard(0, Ref("A"), (0, 3), (0, 4), ROW),))
    assert write_in_place(steps, buffers, [out])[1] == 0
    # a call between the writer and the copies reads the destination
    reader = MapCall(0, "neg", View(Ref("X"), 1, COLS, ROW, "f16"),
                     (View(Ref("B"), 1, COLS, ROW, "f16"),))  # fmt: skip
    steps, buffers = _program(extra=[reader])
    assert write_in_place(steps, buffers, [])[1] == 0
    assert len(steps[0].calls) == 2 + ROWS
    # rows copied at uneven offsets, or overlapping (stride below the row)
    for stride in (4, 6):
        steps, buffers = _program(dst_stride=stride)
        assert write_in_place(steps, buffers, [])[1] == 0
    # one row copied only in part
    steps, buffers = _program()
    steps[0].calls[-1] = CopyCall(0, Ref("B", 48), Ref("A", 16), 4)
    assert write_in_place(steps, buffers, [])[1] == 0
    # the source read again in a later step
    steps, buffers = _program()
    steps.append(ComputeStep([CopyCall(0, Ref("X"), Ref("A"), ROW)]))
    assert write_in_place(steps, buffers, [])[1] == 0


def test_one_copy_of_runs_is_written_in_place_like_row_copies():
    steps, buffers = _program()
    gelu = steps[0].calls[0]
    steps[0].calls[1:] = [CopyCall(0, Ref("B"), Ref("A"), ROW, ROWS, 24, ROW)]
    _, removed = write_in_place(steps, buffers, [])
    assert removed == 1 and steps[0].calls == [
        MapCall(0, "gelu", View(Ref("B"), ROWS, COLS, 24, "f16"), gelu.inputs)
    ]
    # runs that cover only part of the writer's rows leave everything as it was
    steps, buffers = _program()
    steps[0].calls[1:] = [CopyCall(0, Ref("B"), Ref("A"), ROW, ROWS - 1, 24, ROW)]
    assert write_in_place(steps, buffers, [])[1] == 0
