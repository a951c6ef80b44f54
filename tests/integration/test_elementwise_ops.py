"""The elementwise graph operations of graph/elementwise.py and tanh GeLU: compiled, simulated
and compared with NumPy formulas written here (not the package's reference), at odd sizes."""

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph import ComputeGraph
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

TOL = {"f16": 1e-2, "f32": 2e-5}
SHAPE = (3, 7, 13)  # odd sizes: rows and columns do not divide the tiles


def _numpy(kind: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if kind == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return {
        "tanh": np.tanh(x),
        "sigmoid": 1 / (1 + np.exp(-x)),
        "sqrt": np.sqrt(np.abs(x)),
        "reciprocal": 1 / x,
        "neg": -x,
        "relu": np.maximum(x, 0),
        "pow3": x**3,
        "pow_half": np.abs(x) ** 0.5,
        "sub": x - y,
        "div": x / y,
        "sub_row": x - y[0, :1, :],
        "div_col": x / y[:, :, :1],
        "reduce_mean": x.mean(axis=-1, keepdims=True),
    }[kind]


def _graph(kind: str, dtype: str) -> ComputeGraph:
    g = ComputeGraph()
    x = g.host_input("x", SHAPE, dtype)
    y = g.host_input("y", SHAPE, dtype)
    # a gemm first, so the op consumes a computed tensor laid out by the planner
    xc = g.view(g.gemm(g.view(x, (21, 13)), g.parameter("eye", (13, 13), dtype)), SHAPE)
    ops = {
        "gelu_tanh": lambda: g.gelu(xc, approximate="tanh"),
        "tanh": lambda: g.tanh(xc),
        "sigmoid": lambda: g.sigmoid(xc),
        "sqrt": lambda: g.sqrt(xc),
        "reciprocal": lambda: g.reciprocal(xc),
        "neg": lambda: g.neg(xc),
        "relu": lambda: g.relu(xc),
        "pow3": lambda: g.pow(xc, 3.0),
        "pow_half": lambda: g.pow(xc, 0.5),
        "sub": lambda: g.sub(xc, y),
        "div": lambda: g.div(xc, y),
        "sub_row": lambda: g.sub(xc, g.slice(g.slice(y, [0], [1], [0]), [0], [1], [1])),
        "div_col": lambda: g.div(xc, g.slice(y, [0], [1], [2])),
        "reduce_mean": lambda: g.reduce_mean(xc),
    }
    g.set_outputs(ops[kind]())
    return g


KINDS = ["gelu_tanh", "tanh", "sigmoid", "sqrt", "reciprocal", "neg", "relu", "pow3", "pow_half",
         "sub", "div", "sub_row", "div_col", "reduce_mean"]  # fmt: skip


CASES = [(k, "f32") for k in KINDS] + [(k, "f16") for k in ("gelu_tanh", "div_col", "reduce_mean")]


@pytest.mark.parametrize(("kind", "dtype"), CASES)
def test_op_matches_numpy(kind, dtype):
    rng = np.random.default_rng(7)
    np_dtype = np.float16 if dtype == "f16" else np.float32
    x = rng.uniform(-2, 2, SHAPE)
    if kind in ("sqrt", "pow_half"):
        x = np.abs(x) + 0.1
    y = rng.uniform(0.5, 2, SHAPE) * rng.choice([-1, 1], SHAPE)
    x, y = x.astype(np_dtype), y.astype(np_dtype)
    g = _graph(kind, dtype)
    built = build(g, BuildConfig(tiles=5, exchange_time_budget=0.05, compile_kernels=False))
    feeds = {"x": x, "y": y, "eye": np.eye(13, dtype=np_dtype)}
    out = SimDevice().run(built.program, built.placement, built.schedules, feeds).outputs
    got = next(iter(out.values())).astype(np.float64)
    ref = _numpy(kind, x.astype(np.float64), y.astype(np.float64))
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= TOL[dtype] * max(1.0, np.abs(ref).max())


def test_a_wrong_semantics_is_caught(monkeypatch):
    """A mutated kernel semantics (tanh computed as sigmoid) fails the comparison."""
    from ipu_stack.runtime import elementwise_sim

    real = elementwise_sim.elementwise_semantics

    def mutated(call, x):
        if call.kind == "tanh":
            return 1 / (1 + np.exp(-x[0]))
        return real(call, x)

    monkeypatch.setattr("ipu_stack.runtime.sim.elementwise_semantics", mutated)
    with pytest.raises(AssertionError):
        test_op_matches_numpy("tanh", "f32")


def test_bad_arguments():
    g = ComputeGraph()
    x = g.host_input("x", (4, 4), "f32")
    with pytest.raises(GraphError, match="approximate"):
        g.gelu(x, approximate="fast")
    with pytest.raises(GraphError, match="finite"):
        g.pow(x, float("inf"))
    with pytest.raises(GraphError, match="do not broadcast"):
        g.sub(x, g.host_input("y", (3,), "f32"))
