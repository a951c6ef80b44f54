"""The measured F16 GeLU (tanh) and reduce-add formulas of facts §14.3, and who charges them."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.graph import ComputeGraph
from ipu_stack.low.costs import call_cycles
from ipu_stack.low.program import AddCall, ComputeStep, MapCall, Ref, View
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21
from ipu_stack.target.op_cycles import gelu_cycles, reduce_add_cycles

LAUNCH = ipu21.KERNEL_LAUNCH_CYCLES


def _gelu_call(rows: int, cols: int, dtype: str, approximate: str | None) -> MapCall:
    eb = 2 if dtype == "f16" else 4
    view = View(Ref("o"), rows, cols, cols * eb, dtype)
    attrs = (("approximate", approximate),) if approximate else ()
    return MapCall(0, "gelu", view, (view,), attrs)


@pytest.mark.parametrize(("n", "expected"), [(1, 666), (96, 666), (97, 1032), (2208, 8718)])
def test_f16_tanh_gelu_is_the_measured_formula(n: int, expected: int) -> None:
    # facts §14.3: 300 + 366 * ceil(n / 96), written out here rather than imported
    assert gelu_cycles(n, "tanh", "f16") == expected
    assert call_cycles(_gelu_call(1, n, "f16", "tanh")) == expected + LAUNCH


def test_other_gelus_keep_the_planner_constant() -> None:
    # the measurement is of the F16 tanh kernel only: erf and F32 stay at 10 cycles/element
    assert call_cycles(_gelu_call(4, 96, "f16", None)) == 10 * 384 + LAUNCH
    assert call_cycles(_gelu_call(4, 96, "f32", "tanh")) == 10 * 384 + LAUNCH


def test_reduce_add_takes_the_cheaper_measured_kernel() -> None:
    def add_fit(partials: int, n: int) -> int:  # facts §14.1: one pass per added partial
        slope = (2124 - 1368) / (2152 - 1152)
        return int(np.ceil(1368 - slope * 1152 + slope * (partials - 1) * n))

    def one_pass(partials: int, n: int) -> int:  # facts §14.3
        return 282 + 6 * -(-n // 48) * (11 + 2 * (partials - 1))

    # two partials: the add is cheaper; fifteen: the one-pass reduce-add is
    assert reduce_add_cycles(2, 2208, "f16") == add_fit(2, 2208) < one_pass(2, 2208)
    assert reduce_add_cycles(15, 624, "f16") == one_pass(15, 624) < add_fit(15, 624)
    # F32 partials: no measurement of the one-pass kernel, so the add fit
    assert reduce_add_cycles(15, 624, "f32") == add_fit(15, 624)
    # the planner's vectorised form agrees with the scalar one
    parts, n = np.array([2, 4, 15]), np.array([2208, 2208, 624])
    assert reduce_add_cycles(parts, n, "f16").tolist() == [
        reduce_add_cycles(int(p), int(e), "f16") for p, e in zip(parts, n, strict=True)
    ]
    call = AddCall(0, Ref("o"), tuple(Ref(f"p{i}") for i in range(14)), 624, ipu21.F16)
    assert call_cycles(call) == one_pass(15, 624) + LAUNCH


def test_the_simulator_charges_the_tanh_gelu_formula() -> None:
    g = ComputeGraph()
    x = g.host_input("x", (8, 96), "f16")
    g.set_outputs(g.gelu(x, name="g", approximate="tanh"))
    built = build(g, BuildConfig(tiles=1))
    steps = [s for s in built.program.steps if isinstance(s, ComputeStep)]
    gelus = [c for s in steps for c in s.calls if isinstance(c, MapCall) and c.kind == "gelu"]
    assert [call_cycles(c) for c in gelus] == [300 + 366 * 8 + LAUNCH]
    feeds = {"x": np.linspace(-3, 3, 768, dtype=np.float16).reshape(8, 96)}
    result = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    assert result.cycles >= 300 + 366 * 8 + LAUNCH
    assert result.cycles < 10 * 768  # the old per-element constant would exceed this alone
