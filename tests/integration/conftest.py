import numpy as np
import pytest

from ipu_stack.graph import ComputeGraph
from ipu_stack.package.build import BuildConfig, build


def random_feeds(graph, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.values:
        if v.kind != "operation":
            dtype = np.float16 if v.dtype == "f16" else np.float32
            feeds[v.name] = rng.uniform(-1, 1, v.shape).astype(dtype)
    return feeds


@pytest.fixture
def small_build():
    """A GEMM whose exchange phase has tiles receiving from several senders."""
    g = ComputeGraph()
    x = g.host_input("x", (96, 128), "f16")
    w = g.parameter("w", (128, 64), "f16")
    g.set_outputs(g.gemm(x, w, name="mm"))
    built = build(g, BuildConfig(tiles=32))
    return g, built, random_feeds(g)


@pytest.fixture
def feeds_for():
    return random_feeds
