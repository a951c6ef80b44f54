"""Bad-input fuzzing of the CLI: fixtures, mutators and the property every run must satisfy.

Shared by ``tests/property/test_cli_fuzz_property.py`` (Hypothesis, a few hundred cases) and
``benchmarks/fuzz_cli.py`` (thousands). The CLI runs in-process (``ipu_stack.cli.main``).

The property of one case: exit 0 with a correct result, or exit 2 with exactly one stderr line
``ipu-stack: error: ...``; never a traceback (an exception escaping ``main``), never a file left
behind that the command did not report writing (temporary files included). "Correct" is
judged without ipu-stack's own readers: package outputs against NumPy on the unmutated
weights (and bit-identical to the unmutated package's run), ONNX models against onnxruntime.

Oracles for "invalid accepted" (exit 0 where the input is invalid): a package whose bytes
changed without re-signing; a re-signed package whose run differs from the original's (except
when only weight bytes changed, which is a valid package with other weights); an ONNX model
onnxruntime refuses; a snapshot or schedule with a field of the wrong type, a missing key,
another version or format.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.cli import main
from ipu_stack.package.format import HEADER_SIZE, SCHEMA_VERSION, _seal, canonical_json

# -- running one command ------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    traceback: str = ""


def run_cli(argv: list[str]) -> Outcome:
    """``ipu-stack ARGV`` in this process; an escaping exception is recorded as a traceback."""
    out, err = io.StringIO(), io.StringIO()
    tb = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 2
        except BaseException:
            tb = traceback.format_exc()
            code = 1
    return Outcome(int(code), out.getvalue(), err.getvalue(), tb)


@dataclass
class Tally:
    """Counts of a fuzz run."""

    cases: int = 0
    accepted: int = 0
    clean_rejections: int = 0
    tracebacks: int = 0
    invalid_accepted: int = 0
    partial_files: int = 0
    bad_messages: int = 0
    verify_rejections: int = 0
    other_program: int = 0
    code_changed_output: int = 0  # a flipped image bit ran to other outputs (run --check's job)
    by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def record(self, family: str, verdict: str, detail: dict[str, Any] | None = None) -> None:
        self.cases += 1
        counts = self.by_family.setdefault(family, {})
        counts[verdict] = counts.get(verdict, 0) + 1
        attr = {"accepted": "accepted", "rejected": "clean_rejections"}.get(verdict, verdict)
        setattr(self, attr, getattr(self, attr) + 1)
        if verdict not in ("accepted", "rejected", "verify_rejections", "other_program") and detail:
            self.failures.append({"family": family, "verdict": verdict, **detail})

    def ok(self) -> bool:
        return not (
            self.tracebacks or self.invalid_accepted or self.partial_files or self.bad_messages
        )


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def judge(outcome: Outcome, before: set[str], after: set[str], allowed_new: set[str]) -> str | None:
    """The property's verdict on shape alone: None if clean so far, else the failure kind."""
    if outcome.traceback or "Traceback" in outcome.stderr:
        return "tracebacks"
    new = after - before
    if outcome.code == 0:
        if new - allowed_new or any(n.endswith(".tmp") for n in new):
            return "partial_files"
        return None
    if new:
        return "partial_files"
    lines = outcome.stderr.strip().splitlines()
    if outcome.code not in (1, 2) or len(lines) != 1 or not lines[0].startswith("ipu-stack: "):
        return "bad_messages"
    return None


# -- fixtures -----------------------------------------------------------------------------------


@dataclass
class Fixtures:
    root: Path
    package: Path
    package_bytes: bytes
    x: np.ndarray
    weights: dict[str, np.ndarray]
    reference: np.ndarray
    output_bits: bytes
    model: onnx.ModelProto
    snapshot: dict[str, Any]
    schedule: dict[str, Any]


def _tiny_graph_package(root: Path) -> tuple[Path, dict[str, np.ndarray], Any]:
    from ipu_stack import BuildConfig, build_package
    from ipu_stack.exchange.model import IPU21_MODEL
    from ipu_stack.exchange.snapshot import schedule_document, snapshot_document
    from ipu_stack.graph import ComputeGraph
    from ipu_stack.package.build import build

    g = ComputeGraph()
    x = g.host_input("x", (32, 64), "f16")
    w = g.parameter("w", (64, 32), "f16")
    w2 = g.parameter("w2", (32, 32), "f16")
    g.set_outputs(g.gemm(g.gemm(x, w, name="mm"), w2, name="mm2"))
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.uniform(-1, 1, (64, 32)).astype(np.float16),
        "w2": rng.uniform(-1, 1, (32, 32)).astype(np.float16),
    }
    config = BuildConfig(tiles=8)
    path = root / "tiny.ipuexe"
    build_package(g, config, weights, names={"mm2.out": "y"}).save(path)
    built = build(g, config)
    phases = [(i, phase) for i, (phase, _) in sorted(built.schedules.items())]
    schedules = [(i, schedule) for i, (_, schedule) in sorted(built.schedules.items())]
    docs = (snapshot_document(phases, 1472), schedule_document(schedules, IPU21_MODEL))
    return path, weights, docs


def tiny_model(opset: int = 20) -> onnx.ModelProto:
    """y = Gelu(x @ W + b): x [8, 16] float, W [16, 8], b [8]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (16, 8)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.uniform(-1, 1, (8,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Gelu", ["hb"], ["y"], name="act"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def make_fixtures(root: Path) -> Fixtures:
    """Build the unmutated inputs once (about 2 s)."""
    root.mkdir(parents=True, exist_ok=True)
    package, weights, (snapshot, schedule) = _tiny_graph_package(root)
    x = np.random.default_rng(2).uniform(-1, 1, (32, 64)).astype(np.float16)
    np.save(root / "x.npy", x)
    ref = (x.astype(np.float64) @ weights["w"]).astype(np.float16).astype(np.float64)
    reference = ref @ weights["w2"].astype(np.float64)
    fx = Fixtures(
        root, package, package.read_bytes(), x, weights, reference, b"", tiny_model(),
        snapshot, schedule,
    )  # fmt: skip
    out = root / "baseline"
    outcome = run_cli(["run", str(package), "--input", f"x={root / 'x.npy'}",
                       "--output-dir", str(out), "--json"])  # fmt: skip
    assert outcome.code == 0, outcome.stderr + outcome.traceback
    y = np.load(out / "y.npy")
    assert np.abs(y - reference).max() <= 0.02 * np.abs(reference).max()
    fx.output_bits = y.tobytes()
    return fx


# -- package mutations --------------------------------------------------------------------------

_NASTY_INTS = [0, -1, 1, 2, 3, 7, 64, 2**31, 2**40, 2**62, -(2**40)]


def _nasty_value(rng: random.Random, old: Any) -> Any:
    choice = rng.randrange(9)
    if choice == 0:
        return rng.choice(_NASTY_INTS)
    if choice == 1:
        return str(old)
    if choice == 2:
        return float(old) + 0.5 if isinstance(old, int | float) else 0.5
    if choice == 3:
        return None
    if choice == 4:
        return [] if not isinstance(old, list) else old[:-1]
    if choice == 5:
        return not old if isinstance(old, bool) else True
    if choice == 6 and isinstance(old, int) and not isinstance(old, bool):
        return old + rng.choice([-1, 1, 16, -16, 4096])
    if choice == 7:
        return {"x": 1}
    return "x"


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value[:40]) for p in _leaves(v, (*path, i))]
    return [path]


def _mutate_json(rng: random.Random, document: Any) -> tuple[Any, str]:
    """A deep copy with one random leaf or key changed; returns it and a description."""
    doc = copy.deepcopy(document)
    paths = [p for p in _leaves(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[last]
        return doc, f"delete {path}"
    old = parent[last]
    parent[last] = _nasty_value(rng, old)
    return doc, f"set {path} {old!r:.30} -> {parent[last]!r:.30}"


def mutate_package(rng: random.Random, blob: bytes) -> tuple[bytes, str, str]:
    """(mutated bytes, kind, description); kinds: ``unsigned``, ``resigned``, ``weights``."""
    manifest_size = int.from_bytes(blob[16:24], "little")
    manifest = json.loads(blob[HEADER_SIZE : HEADER_SIZE + manifest_size])
    data = bytearray(blob[HEADER_SIZE + manifest_size :])
    how = rng.randrange(6)
    if how == 0:  # raw byte damage anywhere, not re-signed: the digest must catch it
        region = rng.choice(["header", "manifest", "data"])
        lo, hi = {
            "header": (0, HEADER_SIZE),
            "manifest": (HEADER_SIZE, HEADER_SIZE + manifest_size),
            "data": (HEADER_SIZE + manifest_size, len(blob)),
        }[region]
        pos = rng.randrange(lo, hi)
        op = rng.randrange(3)
        if op == 0:
            out = blob[:pos] + bytes([blob[pos] ^ (1 << rng.randrange(8))]) + blob[pos + 1 :]
        elif op == 1:
            out = blob[:pos]
        else:
            out = blob[:pos] + bytes([rng.randrange(256)]) + blob[pos:]
        return out, "unsigned", f"{region} byte {pos} op {op}"
    if how == 1:  # a header field, re-signed
        version = rng.choice([0, 2, SCHEMA_VERSION, 2**32 - 1])
        man = blob[HEADER_SIZE : HEADER_SIZE + manifest_size]
        out = _seal(version, man, bytes(data))
        return out, "resigned" if version != SCHEMA_VERSION else "same", f"version {version}"
    if how in (2, 3):  # a manifest field, re-signed
        mutated, what = _mutate_json(rng, manifest)
        kind = "value" if _int_to_int(what) else "resigned"
        return _reseal_manifest(mutated, bytes(data)), kind, what
    # a table cell or a weight byte, re-signed
    sections = manifest["sections"]
    name = rng.choice(sorted(sections))
    entry = sections[name]
    if not entry["size"]:
        return _reseal_manifest(manifest, bytes(data)), "same", f"empty section {name}"
    if name == "weights":
        pos = entry["offset"] + rng.randrange(entry["size"])
        data[pos] ^= 1 << rng.randrange(8)
        return _reseal_manifest(manifest, bytes(data)), "weights", f"weights byte {pos}"
    if "shape" not in entry:  # another raw-bytes section: the tile images (code, tables, rows)
        pos = entry["offset"] + rng.randrange(entry["size"])
        data[pos] ^= 1 << rng.randrange(8)
        return _reseal_manifest(manifest, bytes(data)), "code", f"{name} byte {pos}"
    rows, cols = entry["shape"]
    cell = rng.randrange(rows * cols)
    pos = entry["offset"] + cell * 8
    old = int.from_bytes(data[pos : pos + 8], "little", signed=True)
    new = rng.choice([*_NASTY_INTS, old + 1, old - 1, old + 4, old * 2])
    data[pos : pos + 8] = int(new).to_bytes(8, "little", signed=True)
    return _reseal_manifest(manifest, bytes(data)), "value", f"{name} cell {cell}: {old}->{new}"


def _int_to_int(what: str) -> bool:
    """Whether a manifest mutation replaced an integer by another integer."""
    if not what.startswith("set "):
        return False
    old, _, new = what.rpartition(" -> ")
    old = old.rsplit(" ", 1)[-1]
    return old.lstrip("-").isdigit() and new.lstrip("-").isdigit()


def _reseal_manifest(manifest: Any, data: bytes) -> bytes:
    try:
        man = canonical_json(manifest)
    except ValueError:
        man = json.dumps(manifest).encode()
    man += b" " * (-len(man) % 8)
    return _seal(SCHEMA_VERSION, man, data)


def package_case(fx: Fixtures, rng: random.Random, work: Path, tally: Tally) -> None:
    """Mutate the tiny package, run it, judge."""
    blob, kind, what = mutate_package(rng, fx.package_bytes)
    path = work / "p.ipuexe"
    path.write_bytes(blob)
    out = work / "out"
    command = rng.choice(["run", "run", "inspect"])
    argv = (
        ["run", str(path), "--input", f"x={fx.root / 'x.npy'}", "--output-dir", str(out)]
        if command == "run"
        else ["package-inspect", str(path), "--bindings", "--tile", "0"]
    )
    before = files_under(work)
    outcome = run_cli(argv)
    after = files_under(work)
    detail = {"mutation": what, "kind": kind, "argv": argv[:1], "stderr": outcome.stderr[-300:],
              "traceback": outcome.traceback[-600:]}  # fmt: skip
    verdict = judge(outcome, before, after, {"out", "out/y.npy"})
    if verdict is None and outcome.code == 1:
        verdict = "bad_messages"  # a package problem must exit 2
    if verdict is None and outcome.code == 0:
        changed = blob != fx.package_bytes
        if kind == "unsigned" and changed:
            verdict = "invalid_accepted"
        elif command == "run" and kind != "weights":
            y = np.load(out / "y.npy")
            if y.shape != fx.reference.shape:
                verdict = "invalid_accepted"
            elif y.tobytes() != fx.output_bits:
                # an in-range integer edit, re-signed, can be another consistent program
                verdict = {"value": "other_program", "code": "code_changed_output"}.get(
                    kind, "invalid_accepted"
                )
    tally.record("package", verdict or ("accepted" if outcome.code == 0 else "rejected"), detail)
    _clear(work)


def _clear(work: Path) -> None:
    for p in sorted(work.rglob("*"), reverse=True):
        if p.is_dir():
            p.rmdir()
        else:
            p.unlink()


# -- snapshot and schedule mutations ------------------------------------------------------------


def _type_changed(old: Any, new: Any) -> bool:
    kind = lambda v: type(v).__name__  # noqa: E731
    return kind(old) != kind(new)


def json_case(fx: Fixtures, rng: random.Random, work: Path, tally: Tally) -> None:
    """Mutate the snapshot or the schedule of the tiny build; verify or bench it."""
    which = rng.choice(["snapshot", "schedule"])
    original = fx.snapshot if which == "snapshot" else fx.schedule
    mutated, what = _mutate_json(rng, original)
    optional = ("'width')", "'kind')")  # documented defaults
    if what.startswith("delete"):
        invalid = not what.endswith(optional)
    else:
        invalid = _structural(original, mutated)
    snap, sched = work / "s.json", work / "t.json"
    snap.write_text(json.dumps(mutated if which == "snapshot" else fx.snapshot))
    sched.write_text(json.dumps(mutated if which == "schedule" else fx.schedule))
    if which == "snapshot" and rng.random() < 0.5:
        argv = ["exchange-bench", str(snap), "--time-budget", "0", "--emit-schedule",
                str(work / "e.json")]  # fmt: skip
        allowed = {"e.json"}
        if not what.startswith("delete"):  # a snapshot alone: fewer transfers is still valid
            invalid = _structural(original, mutated, sublists_valid=True)
    else:
        argv, allowed = ["exchange-verify", str(snap), str(sched)], set()
    before = files_under(work)
    outcome = run_cli(argv)
    after = files_under(work)
    verdict = judge(outcome, before, after, allowed | {"s.json", "t.json"})
    if verdict is None and outcome.code == 1:
        # exchange-verify's answer for a well-formed schedule that breaks a hardware rule
        verdict = (
            "verify_rejections"
            if argv[0] == "exchange-verify" and not invalid
            else ("bad_messages")
        )
    if verdict is None and outcome.code == 0 and invalid:
        verdict = "invalid_accepted"
    detail = {"mutation": f"{which}: {what}", "stderr": outcome.stderr[-300:],
              "traceback": outcome.traceback[-600:]}  # fmt: skip
    tally.record(which, verdict or ("accepted" if outcome.code == 0 else "rejected"), detail)
    _clear(work)


def _structural(original: Any, mutated: Any, sublists_valid: bool = False) -> bool:
    """Whether the mutation changed a type, the format/version, or emptied a list.

    With ``sublists_valid``, a list that kept a non-empty selection of its own items (fewer
    transfers or destinations) is another valid input, not a structural change: a snapshot
    with fewer transfers is a smaller phase that ``exchange-bench`` rightly schedules.
    """
    if isinstance(original, dict) and isinstance(mutated, dict):
        if set(original) != set(mutated):
            return True
        for key in original:
            if key in ("format", "version", "kind") and original[key] != mutated[key]:
                return key != "kind" or not isinstance(mutated[key], str)
            if _structural(original[key], mutated[key], sublists_valid):
                return True
        return False
    if isinstance(original, list) and isinstance(mutated, list):
        if len(original) != len(mutated):
            return not (sublists_valid and mutated and all(m in original for m in mutated))
        return any(
            _structural(a, b, sublists_valid) for a, b in zip(original, mutated, strict=True)
        )
    return _type_changed(original, mutated)


# -- ONNX model mutations -----------------------------------------------------------------------


def mutate_model(rng: random.Random, model: onnx.ModelProto) -> tuple[bytes, str]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    how = rng.randrange(9)
    if how == 0:
        info = rng.choice([*g.input, *g.output])
        dim = rng.choice(info.type.tensor_type.shape.dim)
        dim.dim_value = rng.choice([0, -1, -8, 1, 4, 9, 16, 2**31, 2**40])
        what = f"dim of {info.name} -> {dim.dim_value}"
    elif how == 1:
        info = rng.choice([*g.input, *g.output])
        info.type.tensor_type.elem_type = rng.choice([0, 2, 6, 7, 9, 10, 11, 16, 99])
        what = f"elem_type of {info.name}"
    elif how == 2:
        m.opset_import[0].version = rng.choice([0, 1, 6, 7, 12, 13, 19, 21, 24, 28, 29, 30, 99])
        what = f"opset {m.opset_import[0].version}"
    elif how == 3:
        node = rng.choice(g.node)
        node.input[0] = rng.choice(["nowhere", "y", node.output[0]])
        what = f"node {node.name} input -> {node.input[0]}"
    elif how == 4:
        node = rng.choice(g.node[:2])
        node.output[0] = "y"
        what = f"node {node.name} output duplicated as y"
    elif how == 5:
        node = rng.choice(g.node)
        node.attribute.append(
            rng.choice([helper.make_attribute("approximate", rng.choice(["tanh", "none", "x"])),
                        helper.make_attribute("axis", 1), helper.make_attribute("alpha", 2.0)])
        )  # fmt: skip
        what = f"attribute on {node.name}: {node.attribute[-1].name}"
    elif how == 6:
        init = rng.choice(g.initializer)
        init.dims[0] = rng.choice([0, 1, 3, -2, 32])
        what = f"initializer {init.name} dims {list(init.dims)}"
    elif how == 7:
        blob = m.SerializeToString()
        cut = rng.randrange(len(blob))
        return blob[:cut], f"truncated at {cut}/{len(blob)}"
    else:
        blob = bytearray(m.SerializeToString())
        pos = rng.randrange(len(blob))
        blob[pos] ^= 1 << rng.randrange(8)
        return bytes(blob), f"byte {pos} flipped"
    return m.SerializeToString(), what


def _ort_reference(path: Path, x: np.ndarray | None) -> tuple[bool, np.ndarray | None]:
    """Whether onnxruntime loads the model, and its output for ``x`` (None if it cannot run)."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:
        return False, None
    if x is None:
        return True, None
    try:
        (y,) = session.run(None, {session.get_inputs()[0].name: x})
    except Exception:
        return True, None
    return True, np.asarray(y)


def onnx_case(fx: Fixtures, rng: random.Random, work: Path, tally: Tally) -> None:
    """Mutate the tiny ONNX model; compile it (4 tiles) and run it; compare with onnxruntime."""
    blob, what = mutate_model(rng, fx.model)
    path = work / "m.onnx"
    path.write_bytes(blob)
    pkg = work / "m.ipuexe"
    before = files_under(work)
    outcome = run_cli(["compile", str(path), "-o", str(pkg), "--tiles", "4",
                       "--exchange-budget", "0", "--finalists", "1"])  # fmt: skip
    after = files_under(work)
    verdict = judge(outcome, before, after, {"m.ipuexe"})
    detail = {"mutation": what, "stderr": outcome.stderr[-300:],
              "traceback": outcome.traceback[-600:]}  # fmt: skip
    if verdict is None and outcome.code == 1:
        verdict = "bad_messages"
    if verdict is None and outcome.code == 0:
        verdict = _check_compiled(path, pkg, work)
    tally.record("onnx", verdict or ("accepted" if outcome.code == 0 else "rejected"), detail)
    _clear(work)


def _check_compiled(model: Path, pkg: Path, work: Path) -> str | None:
    proto = onnx.load(str(model))
    info = proto.graph.input[0].type.tensor_type
    shape = [d.dim_value for d in info.shape.dim]
    dtype = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}.get(info.elem_type)
    if dtype is None or not shape or min(shape) <= 0 or np.prod(shape) > 1 << 20:
        return "invalid_accepted"
    x = np.random.default_rng(3).uniform(-1, 1, shape).astype(dtype)
    loads, expected = _ort_reference(model, x)
    if not loads or expected is None:
        return "invalid_accepted"
    np.save(work / "mx.npy", x)
    outcome = run_cli(["run", str(pkg), "--input", f"{proto.graph.input[0].name}={work / 'mx.npy'}",
                       "--output-dir", str(work / "mo")])  # fmt: skip
    if outcome.code != 0:
        return "tracebacks" if outcome.traceback else "invalid_accepted"
    name = proto.graph.output[0].name
    files = list((work / "mo").glob("*.npy"))
    if len(files) != 1:
        return "invalid_accepted"
    got = np.load(files[0]).astype(np.float64)
    want = expected.astype(np.float64)
    if got.shape != want.shape and got.size == want.size:
        got = got.reshape(want.shape)  # the package output keeps the model's shape (checked)
    tol = 0.03 if dtype == np.float16 else 1e-3
    scale = max(float(np.abs(want).max()), 1e-30)
    if got.shape != want.shape or float(np.abs(got - want).max()) > tol * scale:
        return "invalid_accepted"
    del name
    return None


# -- CLI arguments ------------------------------------------------------------------------------

_NUMBERS = ["0", "1", "-1", "3", "4", "8", "16", "1e308", "-1e308", "inf", "nan", "", "x",
            "1.5", "2**40", "1099511627776", "9" * 30, "0x10", " 4", "-0"]  # fmt: skip


def _path(rng: random.Random, fx: Fixtures, work: Path, kind: str) -> str:
    choices = {
        "out": [str(work / "o.json"), str(work / "missing" / "o.json"), str(work),
                str(work / "fifo"), str(fx.package / "x"), ""],
        "dir": [str(work / "d"), str(work / "d" / "e"), str(fx.package), str(work / "fifo"), ""],
        "in": [str(fx.package), str(work / "none.ipuexe"), str(work), "/dev/null", ""],
    }[kind]  # fmt: skip
    return rng.choice(choices)


def cli_argv(rng: random.Random, fx: Fixtures, work: Path) -> list[str]:
    """A random command line over every command, mixing valid and nasty values."""
    num = lambda: rng.choice(_NUMBERS)  # noqa: E731
    small = lambda: rng.choice(["8", "16", "32", num()])  # noqa: E731
    command = rng.randrange(8)
    if command == 0:
        argv = ["gemm", small(), small(), small(), "--tiles", rng.choice(["4", "8", num()])]
        if rng.random() < 0.3:
            argv += ["--precision", rng.choice(["f16", "f32", "f8", "bf16"])]
        if rng.random() < 0.3:
            argv += ["--export-exchange-snapshot", _path(rng, fx, work, "out")]
        if rng.random() < 0.2:
            argv += ["--seed", num()]
        return argv
    if command == 1:
        return ["exchange-bench", str(work / "snap.json"), "--time-budget", num(),
                *(["--max-pieces", num()] if rng.random() < 0.5 else []),
                *(["--phase", num()] if rng.random() < 0.3 else [])]  # fmt: skip
    if command == 2:
        return ["run", _path(rng, fx, work, "in"), "--random-inputs", "--seed",
                rng.choice(["0", num()]), "--output-dir", _path(rng, fx, work, "dir")]  # fmt: skip
    if command == 3:
        return ["package-inspect", _path(rng, fx, work, "in"), "--tile", num()]
    if command == 4:
        return ["compile", str(work / "tiny.onnx"), "-o", _path(rng, fx, work, "out"),
                "--tiles", rng.choice(["4", num()]), "--exchange-budget", num(),
                "--finalists", rng.choice(["1", num()])]  # fmt: skip
    if command == 5:
        return ["exchange-verify", str(work / "snap.json"), _path(rng, fx, work, "in")]
    if command == 6:
        return [
            "run",
            str(fx.package),
            "--input",
            rng.choice(["x", "z", "", "x="])
            + "="
            + rng.choice([str(fx.root / "x.npy"), str(work / "bad.npy"), str(fx.package)]),
        ]
    return [rng.choice(["--version", "gemm", "nonsense", "run", "--help-me", "kernel-flags"]),
            *rng.sample(["--json", "-o", "x", "--tiles", "5"], rng.randrange(3))]  # fmt: skip


def cli_case(fx: Fixtures, rng: random.Random, work: Path, tally: Tally) -> None:
    """One random command line; the property only (no oracle beyond exit 0/2 and files)."""
    (work / "snap.json").write_text(json.dumps(fx.snapshot))
    os.mkfifo(work / "fifo")
    onnx.save(fx.model, str(work / "tiny.onnx"))
    np.save(work / "bad.npy", np.zeros((64, 32), np.float16))  # transposed x
    argv = cli_argv(rng, fx, work)
    before = files_under(work)
    outcome = run_cli(argv)
    after = files_under(work)
    allowed = {"o.json", "d", "d/e", "d/y.npy", "d/e/y.npy", "fifo"}
    verdict = judge(outcome, before, after, allowed)
    if verdict is None and outcome.code == 1 and argv[0] != "gemm":
        verdict = "bad_messages"
    if verdict is None and outcome.code == 0 and argv[0] == "run" and "bad.npy" in " ".join(argv):
        verdict = "invalid_accepted"
    if verdict is None and outcome.code == 0 and any(v in argv for v in ("nan", "inf", "1e308")):
        verdict = "invalid_accepted"
    detail = {"argv": argv, "stderr": outcome.stderr[-300:], "traceback": outcome.traceback[-600:]}
    tally.record("cli", verdict or ("accepted" if outcome.code == 0 else "rejected"), detail)
    _clear(work)


FAMILIES = {"package": package_case, "json": json_case, "onnx": onnx_case, "cli": cli_case}


def env_for_fuzz() -> None:
    """Fuzz runs keep kernel artifacts in a private cache."""
    os.environ.setdefault("IPU_KERNEL_CACHE", "/tmp/ipu-stack-fuzz-kernel-cache")
