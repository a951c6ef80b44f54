"""The ONNX backend node-test harness: classification on a bounded subset, never a crash."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

from ipu_stack import onnx_backend
from ipu_stack.onnx_backend import STATUSES, collect_cases, run_case, summarize

pytest.importorskip("onnx")

#: Cases whose outcome does not depend on how far the tile lowering has come.
UNSUPPORTED = {
    "test_add_int8": "graph input 'x' is int8",
    "test_cast_DOUBLE_to_FLOAT": "graph input 'input' is double",
    "test_cast_FLOAT_to_BFLOAT16": "cast to bfloat16 is not supported",
    "test_layer_normalization_default_axis": "output(s) 'Mean', 'InvStdDev' are not supported",
}
#: One plain float case per op type: these go through build and the simulator.
SUPPORTED = [
    "test_add_bcast",
    "test_gelu_default_2",
    "test_gelu_tanh_1",  # approximate='tanh' (issue 11)
    "test_gemm_all_attributes",
    "test_matmul_bcast",
    "test_mul_bcast",
    "test_reshape_zero_and_negative_dim",
    "test_slice_negative_axes",
    "test_slice_neg_steps",  # strided (and reversed) slices: runs of indices, concatenated
    "test_softmax_axis_0",
    "test_transpose_all_permutations_4",
]


@pytest.fixture(scope="module")
def cases():
    return {case.name: case for case in collect_cases()}


def test_selection_covers_every_op_type(cases):
    op_types = {case.model.graph.node[0].op_type for case in cases.values()}
    assert op_types == set(onnx_backend.OP_TYPES)
    assert all(len(case.model.graph.node) == 1 for case in cases.values())


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_cases_say_why(cases, name):
    result = run_case(cases[name], tiles=8)
    assert result.status == "unsupported"
    assert UNSUPPORTED[name] in result.reason
    assert "ONNX node" in result.reason


@pytest.mark.parametrize("name", SUPPORTED)
def test_supported_cases_pass_on_the_simulator(cases, name):
    result = run_case(cases[name], tiles=16)
    assert result.status == "passed", result.reason
    assert result.max_abs_error is not None and result.max_abs_error < 1e-3


def _fake_case(expected: np.ndarray, op: str = "Add") -> SimpleNamespace:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(
        helper.make_graph([helper.make_node(op, ["x", "x"][: 2 if op == "Add" else 1], ["y"])],
                          "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 20)],
    )  # fmt: skip
    inputs = [np.ones((2, 3), np.float32)]
    return SimpleNamespace(
        name=f"fake_{op}", model=model, data_sets=[(inputs, [expected])], rtol=1e-3, atol=1e-7
    )


def test_wrong_result_is_failed_with_the_error():
    result = run_case(_fake_case(np.full((2, 3), 3.0, np.float32)), tiles=4)
    assert result.status == "failed"
    assert "outside rtol" in result.reason and result.max_abs_error == pytest.approx(1.0)


def test_wrong_dtype_is_failed():
    result = run_case(_fake_case(np.full((2, 3), 2.0, np.float64)), tiles=4)
    assert result.status == "failed" and "float32, expected float64" in result.reason


def test_unexpected_exception_is_failed_not_raised(monkeypatch):
    def broken_build(*args, **kwargs):
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr("ipu_stack.package.build.build", broken_build)
    result = run_case(_fake_case(np.full((2, 3), 2.0, np.float32)), tiles=4)
    assert result.status == "failed"
    assert result.reason == "RuntimeError: lowering exploded"


def test_unknown_operator_is_unsupported():
    result = run_case(_fake_case(np.ones((2, 3), np.float32), op="Elu"), tiles=4)
    assert result.status == "unsupported" and "op type 'Elu' is not supported" in result.reason


def test_summary_counts_per_op_type():
    results = [
        onnx_backend.CaseResult("a", "Add", "passed"),
        onnx_backend.CaseResult("b", "Add", "unsupported", "GraphError: x; y"),
        onnx_backend.CaseResult("c", "Cast", "failed", "SimulationError: z"),
    ]
    summary = summarize(results)
    assert summary["totals"] == {"passed": 1, "failed": 1, "unsupported": 1}
    assert summary["by_op_type"]["Add"] == {"passed": 1, "failed": 0, "unsupported": 1}
    assert set(summary["by_op_type"]["Cast"]) == set(STATUSES)
    assert len(summary["results"]) == 3
