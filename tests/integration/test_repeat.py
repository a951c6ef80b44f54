"""repeat: a structured loop lowered once, equal to the unrolled program."""

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.low.program import ComputeStep, Ref, RepeatStep
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.place import assign
from ipu_stack.runtime.sim import SimDevice

T, H, INNER = 64, 48, 96


def block(g, x, w1, w2):
    return g.add(g.gemm(g.gelu(g.gemm(x, w1)), w2), x)


def repeated(n):
    g = ComputeGraph()
    x = g.host_input("x", (T, H), "f32")
    w1 = g.parameter("W1", (n, H, INNER), "f32")
    w2 = g.parameter("W2", (n, INNER, H), "f32")
    y = g.repeat(n, x, [], [w1, w2], lambda sg, c, inv, it: block(sg, c, it[0], it[1]))
    g.set_outputs(y)
    return g, y


def feeds_for(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "x": rng.uniform(-1, 1, (T, H)).astype(np.float32),
        "W1": (rng.uniform(-1, 1, (n, H, INNER)) * 0.2).astype(np.float32),
        "W2": (rng.uniform(-1, 1, (n, INNER, H)) * 0.2).astype(np.float32),
    }


def test_three_blocks_match_reference_and_unrolled():
    g, y = repeated(3)
    built = build(g, BuildConfig(tiles=64))
    feeds = feeds_for(3)
    out = SimDevice().run(built.program, built.placement, built.schedules, feeds).outputs[y.name]
    ref = evaluate_reference(g, feeds)[y.name]
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()

    u = ComputeGraph()
    z = u.host_input("x", (T, H), "f32")
    unrolled_feeds = {"x": feeds["x"]}
    for i in range(3):
        unrolled_feeds[f"a{i}"], unrolled_feeds[f"b{i}"] = feeds["W1"][i], feeds["W2"][i]
        z = block(
            u, z, u.parameter(f"a{i}", (H, INNER), "f32"), u.parameter(f"b{i}", (INNER, H), "f32")
        )
    u.set_outputs(z)
    ub = build(u, BuildConfig(tiles=64))
    unrolled = SimDevice().run(ub.program, ub.placement, ub.schedules, unrolled_feeds)
    np.testing.assert_array_equal(unrolled.outputs[z.name], out)


def test_body_is_lowered_once():
    sizes = []
    for n in (2, 5):
        g, _ = repeated(n)
        program = build(g, BuildConfig(tiles=64)).program
        loops = [s for s in program.steps if isinstance(s, RepeatStep)]
        assert len(loops) == 1 and loops[0].count == n
        sizes.append(len(program.steps))
    assert sizes[0] == sizes[1]


def test_bad_repeat_arguments():
    g = ComputeGraph()
    x = g.host_input("x", (4, 4), "f32")
    w = g.parameter("w", (2, 4, 4), "f32")
    with pytest.raises(GraphError, match="leading axis of 3"):
        g.repeat(3, x, [], [w], lambda sg, c, inv, it: sg.gemm(c, it[0]))
    with pytest.raises(GraphError, match="carried shape"):
        g.repeat(2, x, [], [w], lambda sg, c, inv, it: sg.slice(c, [0], [2], [0]))


def _norm_stack(n, cols=1024, rows=64):
    """``n`` layer norms in a loop, each with its own scale and bias (as an encoder's)."""
    g = ComputeGraph()
    x = g.host_input("x", (rows, cols), "f32")
    scale = g.parameter("scale", (n, cols), "f32")
    bias = g.parameter("bias", (n, cols), "f32")
    y = g.repeat(n, x, [], [scale, bias], lambda sg, c, inv, it: sg.layer_norm(c, it[0], it[1]))
    g.set_outputs(y)
    rng = np.random.default_rng(3)
    feeds = {
        "x": rng.uniform(-1, 1, (rows, cols)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, (n, cols)).astype(np.float32),
        "bias": rng.uniform(-0.5, 0.5, (n, cols)).astype(np.float32),
    }
    return g, y, feeds


def test_deep_loop_stages_parameters_it_cannot_replicate():
    # 80 layers of F32 scale and bias are 640 KiB per tile if every tile of the rows keeps
    # them all (more than a tile has); stored once and moved in per iteration they fit
    g, y, feeds = _norm_stack(80)
    built = build(g, BuildConfig(tiles=8))
    staged = [b for b in built.program.buffers if b.name.endswith(".home")]
    assert staged and all(b.host_written for b in staged)
    out = SimDevice().run(built.program, built.placement, built.schedules, feeds).outputs[y.name]
    ref = evaluate_reference(g, feeds)[y.name]
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


def test_loop_exchange_rows_do_not_grow_with_depth():
    # exchange rows are code: a loop's are stored once, whatever its count
    sizes = []
    for n in (4, 27):
        g, _ = repeated(n)
        built = build(g, BuildConfig(tiles=64))
        assert built.images is not None
        sizes.append(max(image.row_bytes for image in built.images.tiles))
    assert sizes[0] == sizes[1] > 0


def test_body_buffers_written_then_read_in_one_step_live_from_that_step():
    # a step that writes a buffer and then reads it (a GEMM's output summed by the next call,
    # a kernel's output copied on) holds nothing of the last iteration in it: the buffer lives
    # from that step, not for the whole body (the So400m tower at batch 2 needs those bytes)
    g, _ = repeated(3)
    program = build(g, BuildConfig(tiles=64)).program
    loop = next(i for i, s in enumerate(program.steps) if isinstance(s, RepeatStep))
    body = range(loop + 1, loop + 1 + program.steps[loop].length)
    spans = assign.buffer_lifetimes(program)
    seen: set[tuple[int, str]] = set()
    both: list[tuple[tuple[int, str], int]] = []
    for i in body:
        step = program.steps[i]
        if not isinstance(step, ComputeStep):
            continue
        written = {k for k, read in assign._compute_touches(step).items() if not read}
        read_too = set()
        for call in step.calls:
            for name in ("left", "right", "src"):
                ref = getattr(call, name, None)
                if isinstance(ref, Ref):
                    read_too.add((call.tile, ref.buffer))
        both += [(k, i) for k in written & read_too if k not in seen]
        seen.update(assign._compute_touches(step))
    assert both
    for key, first in both:
        assert spans[key][0] == first > loop + 1
