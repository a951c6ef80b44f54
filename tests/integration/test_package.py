"""The .ipuexe package: round trip, determinism, validation on load, Session on the simulator."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

import ipu_stack
from ipu_stack import BuildConfig, ComputeGraph, Package, Session, SimDevice, build_package
from ipu_stack.errors import GraphError, PackageError, SimulationError
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.package.assemble import assemble_package
from ipu_stack.package.build import build
from ipu_stack.package.format import HEADER_SIZE, SCHEMA_VERSION, reseal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TILES = 32
#: max |error| <= tolerance x max |reference| (the operator issue's thresholds)
TOLERANCE = {"f16": 0.03, "f32": 1e-3}


def _compiled(name: str):
    graph, bindings = import_onnx(EXAMPLES / f"{name}.onnx")
    names = {v.name: k for k, v in bindings.inputs.items()}
    names.update({v.name: k for k, v in bindings.outputs.items()})
    built = build(graph, BuildConfig(tiles=TILES))
    return graph, bindings, built, assemble_package(built, bindings.parameters, names=names)


@pytest.fixture(scope="module")
def mlp2():
    return _compiled("mlp2")


@pytest.fixture(scope="module")
def mlp2_f32():
    return _compiled("mlp2_f32")


@pytest.fixture(scope="module")
def gemm_chain():
    """x [64, 128] through four GEMMs (GeLU after the first and third): enough steps that some
    allocation on a GEMM's tile is dead at its call (mlp2 now runs both its GEMMs in one
    compute step, where every allocation of a GEMM tile is live or overlaps a live one)."""
    rng = np.random.default_rng(0)
    g = ComputeGraph()
    h = g.host_input("x", (64, 128), "f16")
    params = {}
    for i, (k, n) in enumerate(((128, 512), (512, 128), (128, 512), (512, 128))):
        params[f"w{i}"] = rng.normal(0, 0.05, (k, n)).astype(np.float16)
        h = g.gemm(h, g.parameter(f"w{i}", (k, n), "f16"), name=f"g{i}")
        h = g.gelu(h) if i % 2 == 0 else h
    g.set_outputs(h)
    built = build(g, BuildConfig(tiles=TILES))
    return g, None, built, assemble_package(built, params)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("example", ["mlp2", "mlp2_f32"])
def test_saved_package_runs_bit_identical_to_in_memory_and_matches_onnxruntime(
    example, request, tmp_path
):
    ort = pytest.importorskip("onnxruntime")
    _, bindings, built, package = request.getfixturevalue(example)
    value = bindings.inputs["x"]
    dtype = np.float16 if value.dtype == "f16" else np.float32
    x = np.random.default_rng(1).uniform(-1, 1, value.shape).astype(dtype)

    in_memory = SimDevice().run(built.program, built.placement, built.schedules,
                                bindings.feeds({"x": x}))  # fmt: skip
    path = tmp_path / "model.ipuexe"
    size, digest = package.write(path)
    assert size == path.stat().st_size and digest == package.digest == Package.load(path).digest
    session = Session(SimDevice()).load(path)
    session.initialize()
    y = session.run({"x": x})["y"]

    expected = in_memory.outputs[bindings.outputs["y"].name]
    assert y.dtype == expected.dtype and y.shape == expected.shape
    assert np.array_equal(_bits(y), _bits(expected))
    # the package runs from its tile images: exchange time from the executed rows, within 5%
    # of the scheduled estimate (the in-memory run's 600 + horizon per phase)
    run = session.last_run
    assert run is not None and abs(run.cycles - in_memory.cycles) <= 0.05 * in_memory.cycles
    profile = session.profile
    assert profile is not None and profile.end_cycles.shape == (len(built.program.steps), TILES)
    assert (profile.step_cycles() >= 0).all()
    assert profile.end_cycles[-1].max() == run.cycles

    reference = ort.InferenceSession(str(EXAMPLES / f"{example}.onnx"))
    (want,) = reference.run(["y"], {"x": x})
    error = np.abs(y.astype(np.float64) - want.astype(np.float64)).max()
    assert error <= TOLERANCE[value.dtype] * np.abs(want).max()


def test_assembly_is_deterministic_and_leaves_wall_clock_out(mlp2):
    _, bindings, built, package = mlp2
    names = {v.name: k for k, v in bindings.inputs.items()}
    names.update({v.name: k for k, v in bindings.outputs.items()})
    built.trace.phases[0]["elapsed_ms"] += 12345  # another machine, another wall clock
    again = assemble_package(built, bindings.parameters, names=names)
    assert again.to_bytes() == package.to_bytes()
    report = again.manifest["report"]
    assert [p["name"] for p in report["phases"]][:2] == ["lower_mid", "select_finalist"]
    assert all("elapsed_ms" not in phase for phase in report["phases"])
    assert all(e["event"] != "kernel cache hit" for e in report["events"])
    assert report["kernels"] and all("cache_hit" not in k for k in report["kernels"])
    kernels = package.manifest["kernels"]
    assert kernels and all(k["key"] and k["symbols"] and k["source_digests"] for k in kernels)


def test_load_round_trips_manifest_and_data(mlp2, tmp_path):
    *_, package = mlp2
    size = package.save(tmp_path / "m.ipuexe")
    loaded = Package.load(tmp_path / "m.ipuexe")
    assert size == (tmp_path / "m.ipuexe").stat().st_size
    assert loaded.manifest == package.manifest and loaded.data == package.data
    assert loaded.digest == package.digest
    assert [p.name for p in tmp_path.iterdir()] == ["m.ipuexe"]  # no temporary left behind


def test_weights_are_embedded_once_and_uploaded_from_the_package(mlp2):
    _, bindings, _, package = mlp2
    weights = package.bindings("weight")
    assert {w["name"] for w in weights} == set(bindings.parameters)
    total = sum(a.nbytes for a in bindings.parameters.values())
    # Replicated blocks are stored once: never more than the parameters plus padding.
    assert package.manifest["sections"]["weights"]["size"] <= total + 8 * 64 * len(weights)
    session = Session().load(package)
    session.initialize()
    assert session.weights is not None
    for name, array in bindings.parameters.items():
        assert np.array_equal(_bits(session.weights[name]), _bits(array))


def test_session_errors_are_user_errors(mlp2):
    *_, package = mlp2
    session = Session().load(package)
    x = np.zeros((64, 128), np.float16)
    with pytest.raises(GraphError, match="initialize"):
        session.run({"x": x})
    session.initialize()
    with pytest.raises(GraphError, match="no data for input 'x'"):
        session.run({})
    with pytest.raises(GraphError, match="expects shape"):
        session.run({"x": np.zeros((3, 3), np.float16)})
    with pytest.raises(GraphError, match="no input named 'z'"):
        session.run({"x": x, "z": x})


def test_public_api_builds_and_runs_a_graph():
    assert {"ComputeGraph", "build_package", "Package", "Session", "SimDevice"} <= set(
        ipu_stack.__all__
    )
    g = ComputeGraph()
    x = g.host_input("x", (32, 48), "f32")
    w = g.parameter("w", (48, 16), "f32")
    g.set_outputs(g.gemm(x, w, name="mm"))
    rng = np.random.default_rng(0)
    weights = {"w": rng.uniform(-1, 1, (48, 16)).astype(np.float32)}
    package = build_package(g, BuildConfig(tiles=8), weights)
    session = Session(SimDevice()).load(Package.from_bytes(package.to_bytes()))
    session.initialize()
    feed = rng.uniform(-1, 1, (32, 48)).astype(np.float32)
    got = session.run({"x": feed})["mm.out"]
    want = evaluate_reference(g, {"x": feed, **weights})["mm.out"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_weights_not_embedded_must_be_given_to_initialize():
    g = ComputeGraph()
    x = g.host_input("x", (16, 16), "f16")
    w = g.parameter("w", (16, 16), "f16")
    g.set_outputs(g.gemm(x, w, name="mm"))
    package = build_package(g, BuildConfig(tiles=4))
    session = Session().load(package)
    with pytest.raises(GraphError, match="no data for weight 'w'"):
        session.initialize()
    eye = np.eye(16, dtype=np.float16)
    session.initialize({"w": eye})
    feed = np.arange(256, dtype=np.float16).reshape(16, 16) / 256
    assert np.array_equal(session.run({"x": feed})["mm.out"], feed)


# -- validation ---------------------------------------------------------------------------------
def _edited(package: Package, edit) -> bytes:
    manifest = copy.deepcopy(package.manifest)
    edit(manifest)
    return Package(manifest, package.data).to_bytes()


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m.update(tiles=[]), "no tiles"),
        (lambda m: m["tiles"].__setitem__(1, m["tiles"][0]), "appears twice"),
        (lambda m: m.update(target="ipu2"), "target 'ipu2'"),
        (lambda m: m.update(tile_memory_size=1 << 20), "does not match"),
        (lambda m: m["bindings"][0].update(name=""), "empty or missing name"),
        (lambda m: m["bindings"][1].update(name=m["bindings"][0]["name"]), "defined twice"),
        (lambda m: m["bindings"][0].update(shape=[64, 0]), "bad shape"),
        (lambda m: m["bindings"][0].update(shape=[2, 2]), "outside the value"),
        (lambda m: m["host_calls"].pop(), "host calls are"),
        (lambda m: m["host_calls"][0].update(writes=["x"]), "host call 'initialize' writes"),
        (lambda m: m["sections"]["pieces"].update(offset=1 << 30), "runs past the data"),
        (lambda m: m["program"]["steps"][0].update(kind="sync"), "unknown step kind"),
    ],
)
def test_inconsistent_manifest_is_rejected_with_what_and_where(mlp2, edit, message):
    *_, package = mlp2
    with pytest.raises(PackageError, match=message) as info:
        Package.from_bytes(_edited(package, edit), "model.ipuexe")
    assert str(info.value).startswith("model.ipuexe: ")


def _with_table(package: Package, name: str, table: np.ndarray) -> bytes:
    manifest = copy.deepcopy(package.manifest)
    pad = -len(package.data) % 8
    data = package.data + b"\0" * pad
    manifest["sections"][name].update(offset=len(data), size=table.nbytes)
    manifest["sections"][name]["shape"] = [int(table.shape[0]), int(table.shape[1])]
    return Package(manifest, data + table.astype("<i8").tobytes()).to_bytes()


def test_segments_outside_memory_or_overlapping_are_rejected(mlp2):
    *_, package = mlp2
    seg = package.table("segments").copy()
    outside = seg.copy()
    outside[0, 1] = 0x1000
    with pytest.raises(PackageError, match=r"segment \[0x1000.*outside tile memory"):
        Package.from_bytes(_with_table(package, "segments", outside))
    shifted = seg[:1].copy()
    shifted[0, 1] += 8
    overlap = np.vstack([seg, shifted])
    with pytest.raises(PackageError, match=f"tile {seg[0, 0]}: segments .* overlap"):
        Package.from_bytes(_with_table(package, "segments", overlap))


def test_binding_slice_outside_tile_memory_is_rejected(mlp2):
    *_, package = mlp2
    slices = package.table("slices").copy()
    slices[3, 1] = 0xE7000  # inside tile memory but in no segment of the tile
    with pytest.raises(PackageError, match=r"binding 'x': slice 3 on tile .* segments"):
        Package.from_bytes(_with_table(package, "slices", slices))


def test_corrupt_bytes_are_rejected(mlp2):
    *_, package = mlp2
    blob = package.to_bytes()
    with pytest.raises(PackageError, match="truncated"):
        Package.from_bytes(blob[: len(blob) // 2])
    with pytest.raises(PackageError, match="truncated"):
        Package.from_bytes(blob[:20])
    flipped = bytearray(blob)
    flipped[HEADER_SIZE + 100] ^= 0x01
    with pytest.raises(PackageError, match="digest mismatch"):
        Package.from_bytes(bytes(flipped))
    with pytest.raises(PackageError, match=f"schema version {SCHEMA_VERSION + 1} is not"):
        Package.from_bytes(reseal(blob, SCHEMA_VERSION + 1))
    with pytest.raises(PackageError, match=r"not an \.ipuexe"):
        Package.from_bytes(b"PK\x03\x04" + blob[4:])
    with pytest.raises(PackageError, match="trailing bytes"):
        Package.from_bytes(blob + b"\0")


def test_failed_save_leaves_no_file(mlp2, tmp_path, monkeypatch):
    *_, package = mlp2
    with pytest.raises(PackageError, match="cannot write"):
        package.save(tmp_path / "missing" / "m.ipuexe")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ipu_stack.package.format.os.replace", broken_replace)
    with pytest.raises(PackageError, match="No space left"):
        package.save(tmp_path / "m.ipuexe")
    assert list(tmp_path.iterdir()) == []


def _dead_allocation(package: Package):
    """(step, call position, allocation) where the allocation's start is live in no buffer."""
    alloc = package.table("allocations")
    for index, step in enumerate(package.manifest["program"]["steps"]):
        if step["kind"] != "compute":
            continue
        for position, call in enumerate(step["calls"]):
            if call[0] != "gemm":
                continue
            mine = alloc[alloc[:, 0] == call[1]]
            live = mine[(mine[:, 3] <= index) & (index < mine[:, 4])]
            for i in np.flatnonzero(alloc[:, 0] == call[1]).tolist():
                start = alloc[i, 1]
                inside = (live[:, 1] <= start) & (start < live[:, 1] + live[:, 2])
                if not alloc[i, 3] <= index < alloc[i, 4] and not inside.any():
                    return index, position, i
    raise AssertionError("no allocation is dead at a gemm call")


def test_session_does_not_trust_program_addresses(gemm_chain):
    *_, package = gemm_chain
    index, position, dead = _dead_allocation(package)
    call = package.manifest["program"]["steps"][index]["calls"][position]

    def point_out_at(address):
        def edit(m):
            m["program"]["steps"][index]["calls"][position][2] = address

        return Package.from_bytes(_edited(package, edit))

    with pytest.raises(PackageError, match=f"step {index} gemm call: tile {call[1]} address"):
        Session().load(point_out_at(0xE7000))  # inside tile memory, in no allocation
    # An allocation that is not live at this step: the simulator reports the lifetime (the
    # step description is debug metadata now: run it on purpose).
    name = package.manifest["allocation_names"][dead]
    session = Session(execution="description")
    session.load(point_out_at(int(package.table("allocations")[dead, 1])))
    session.initialize()
    with pytest.raises(SimulationError, match=f"uses '{name}' outside its lifetime"):
        session.run({"x": np.zeros((64, 128), np.float16)})


def test_session_does_not_trust_operand_tables_in_the_images(gemm_chain):
    """The same wrong output address, put in the call's operand table in the tile image."""
    *_, package = gemm_chain
    index, position, dead = _dead_allocation(package)
    call = package.manifest["program"]["steps"][index]["calls"][position]
    tile, out, left, right = call[1], call[2], call[3], call[4]
    data = bytearray(package.data)
    base = package.manifest["sections"]["images"]["offset"]
    words = np.frombuffer(package.data, "<u4")
    found = False
    for t, _, size, flags, off in package.table("segments").tolist():
        if t != tile or flags != 1 or off < 0:
            continue
        table = words[(base + off) // 4 : (base + off + size) // 4]
        hits = np.flatnonzero((table[:-3] == index) & (table[1:-2] == out)
                              & (table[2:-1] == left) & (table[3:] == right))  # fmt: skip
        for h in hits.tolist():
            at = base + off + 4 * (h + 1)
            data[at : at + 4] = int(package.table("allocations")[dead, 1]).to_bytes(4, "little")
            found = True
    assert found
    edited = Package.from_bytes(Package(package.manifest, bytes(data)).to_bytes())
    session = Session().load(edited)
    session.initialize()
    name = package.manifest["allocation_names"][dead]
    with pytest.raises(SimulationError, match=f"uses '{name}' outside its lifetime"):
        session.run({"x": np.zeros((64, 128), np.float16)})


def test_repeat_loop_round_trips_bit_identical():
    from ipu_stack.low.program import RepeatStep

    rng = np.random.default_rng(0)
    g = ComputeGraph()
    x = g.host_input("x", (32, 48), "f32")
    w = g.parameter("W", (3, 48, 48), "f32")
    y = g.repeat(3, x, [], [w], lambda sg, c, inv, it: sg.add(sg.gemm(c, it[0]), c))
    g.set_outputs(y)
    feeds = {
        "x": rng.uniform(-1, 1, (32, 48)).astype(np.float32),
        "W": (rng.uniform(-1, 1, (3, 48, 48)) * 0.2).astype(np.float32),
    }
    built = build(g, BuildConfig(tiles=16))
    assert any(isinstance(s, RepeatStep) for s in built.program.steps)
    package = Package.from_bytes(assemble_package(built, {"W": feeds["W"]}).to_bytes())
    assert [s["kind"] for s in package.manifest["program"]["steps"]].count("repeat") >= 1
    session = Session().load(package)
    session.initialize()
    got = session.run({"x": feeds["x"]})[y.name]
    want = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    assert np.array_equal(_bits(got), _bits(want.outputs[y.name]))
    assert session.last_run is not None
    assert abs(session.last_run.cycles - want.cycles) <= 0.05 * want.cycles


def test_f8_weights_and_scaled_gemm_round_trip_bit_identical():
    rng = np.random.default_rng(1)
    g = ComputeGraph()
    x = g.host_input("x", (48, 64), "f8", scale_exponent=-4)
    w = g.parameter("w", (64, 32), "f8", scale_exponent=-6)
    y = g.gemm(x, w)
    z = g.cast(g.gelu(y), "f8", scale_exponent=-3)
    g.set_outputs(y, z)
    feeds = {
        "x": rng.uniform(-1, 1, (48, 64)).astype(np.float32),
        "w": (rng.uniform(-1, 1, (64, 32)) * 0.25).astype(np.float32),
    }
    built = build(g, BuildConfig(tiles=16))
    package = Package.from_bytes(assemble_package(built, {"w": feeds["w"]}).to_bytes())
    assert {b["name"]: b["scale_exponent"] for b in package.bindings()}["w"] == -6
    session = Session().load(package)
    session.initialize()
    got = session.run({"x": feeds["x"]})
    want = SimDevice().run(built.program, built.placement, built.schedules, feeds).outputs
    for name in (y.name, z.name):
        assert np.array_equal(_bits(got[name]), _bits(want[name]))
