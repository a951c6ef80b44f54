"""ipu-stack: a compiler, packager and simulator for Graphcore IPU21 tile machines.

The public API::

    from ipu_stack import ComputeGraph, build_package, Package, Session, SimDevice

    package = build_package(graph, BuildConfig(tiles=64), parameters)  # compile + assemble
    package.save("model.ipuexe")
    session = Session(SimDevice()).load("model.ipuexe")  # validates the file
    session.initialize()  # uploads the embedded weights
    outputs = session.run({"x": x})

Names resolve on first use, so ``import ipu_stack`` (and the CLI) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipu_stack.graph.compute_graph import ComputeGraph
    from ipu_stack.package.assemble import build_package
    from ipu_stack.package.build import BuildConfig
    from ipu_stack.package.format import Package
    from ipu_stack.runtime.session import Session
    from ipu_stack.runtime.sim import SimDevice

_EXPORTS = {
    "ComputeGraph": "ipu_stack.graph.compute_graph",
    "BuildConfig": "ipu_stack.package.build",
    "build_package": "ipu_stack.package.assemble",
    "Package": "ipu_stack.package.format",
    "Session": "ipu_stack.runtime.session",
    "SimDevice": "ipu_stack.runtime.sim",
}

__all__ = ["BuildConfig", "ComputeGraph", "Package", "Session", "SimDevice", "build_package"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ipu_stack' has no attribute {name!r}")
