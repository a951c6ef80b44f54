"""A flipped byte can leave a node name that is not UTF-8: named, never a traceback."""

from pathlib import Path

import onnx
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph.onnx_import import import_onnx

MLP2 = Path(__file__).resolve().parents[2] / "examples" / "mlp2.onnx"


def test_a_name_that_is_not_utf8_is_refused_naming_the_node():
    raw = bytearray(onnx.load(str(MLP2)).SerializeToString())
    at = raw.find(b"Gemm_5")
    raw[at + 1] = 0xFF
    model = onnx.ModelProto()
    model.ParseFromString(bytes(raw))
    assert isinstance(model.graph.node[0].name, bytes)  # what protobuf hands back
    with pytest.raises(GraphError, match=r"node 0 \('Gemm'\) has a name that is not valid UTF-8"):
        import_onnx(model)
