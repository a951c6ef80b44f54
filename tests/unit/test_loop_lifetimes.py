"""Buffer lifetimes inside loop bodies (place/assign.py: buffer_lifetimes)."""

from __future__ import annotations

from ipu_stack.low.program import ExchangeStep, LogicalTransfer, Ref
from ipu_stack.place import assign


def test_a_loop_buffer_received_in_part_lives_through_the_body():
    """Inside a loop body, a buffer whose first touch writes it whole may reuse its bytes
    after its last use; one an exchange fills only in part keeps its other bytes, so it
    lives through the whole body (MobileNetV3's rolled blocks read such 8-byte rows, half of
    them received: their bytes were given to other buffers, a 2% error)."""
    from ipu_stack.low.program import Buffer, ComputeStep, CopyCall, LowProgram, RepeatStep

    def program(words: int) -> LowProgram:
        body = [
            ComputeStep([CopyCall(0, Ref("src", 0), Ref("seed", 0), 8)]),
            ExchangeStep("fill", [LogicalTransfer(0, Ref("src", 0), ((1, Ref("row", 0)),), words)]),
            ComputeStep([CopyCall(1, Ref("sink", 0), Ref("row", 0), 8)]),
            ComputeStep([CopyCall(1, Ref("other", 0), Ref("sink", 0), 8)]),
        ]
        buffers = [
            Buffer(0, "seed", 8, 8, "any", host_written=True),
            Buffer(0, "src", 8, 8, "any"),
            Buffer(1, "row", 8, 8, "any"),
            Buffer(1, "sink", 8, 8, "any"),
            Buffer(1, "other", 8, 8, "any", host_read=True),
        ]
        return LowProgram(2, buffers, [RepeatStep(2, len(body)), *body], [], 0, 0, {})

    whole = assign.buffer_lifetimes(program(2))
    part = assign.buffer_lifetimes(program(1))
    assert whole[(1, "row")] == (2, 3)  # received whole: free after its last use
    assert part[(1, "row")] == (1, 4)  # 4 of its 8 bytes received: the whole body
