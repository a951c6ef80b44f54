"""Property: for any mutated package, snapshot, schedule, ONNX model or command line, the CLI
exits 0 with a correct result or 2 with one line; never a traceback, never a partial file.

The cases and oracles are in ``fuzz_cases.py``; ``benchmarks/fuzz_cli.py`` runs thousands.
"""

from __future__ import annotations

import random

import fuzz_cases
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = {"deadline": None, "derandomize": True,
            "suppress_health_check": [HealthCheck.function_scoped_fixture]}  # fmt: skip


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return fuzz_cases.make_fixtures(tmp_path_factory.mktemp("fuzz") / "fixtures")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-work")


def _run(family, fixtures, work, seed):
    tally = fuzz_cases.Tally()
    fuzz_cases.FAMILIES[family](fixtures, random.Random(seed), work, tally)
    assert tally.ok(), tally.failures
    assert tally.cases == 1


@settings(max_examples=60, **SETTINGS)
@given(seed=st.integers(0, 2**64 - 1))
def test_mutated_packages(fixtures, work, seed):
    _run("package", fixtures, work, seed)


@settings(max_examples=60, **SETTINGS)
@given(seed=st.integers(0, 2**64 - 1))
def test_mutated_snapshots_and_schedules(fixtures, work, seed):
    _run("json", fixtures, work, seed)


@settings(max_examples=25, **SETTINGS)
@given(seed=st.integers(0, 2**64 - 1))
def test_random_command_lines(fixtures, work, seed):
    _run("cli", fixtures, work, seed)


@settings(max_examples=6, **SETTINGS)
@given(seed=st.integers(0, 2**64 - 1))
def test_mutated_onnx_models(fixtures, work, seed):
    _run("onnx", fixtures, work, seed)


def test_the_harness_catches_each_failure_kind(fixtures, work, monkeypatch):
    """Mutating the checked thing: a traceback, a stray file, two lines, a wrong result."""

    def boom(argv):
        raise ValueError("bug")

    monkeypatch.setattr(fuzz_cases, "main", boom)
    outcome = fuzz_cases.run_cli(["run"])
    assert outcome.traceback and fuzz_cases.judge(outcome, set(), set(), set()) == "tracebacks"
    ok = fuzz_cases.Outcome(2, "", "ipu-stack: error: x\n")
    assert fuzz_cases.judge(ok, set(), set(), set()) is None
    assert fuzz_cases.judge(ok, set(), {"a.tmp"}, set()) == "partial_files"
    two = fuzz_cases.Outcome(2, "", "ipu-stack: error: x\nmore\n")
    assert fuzz_cases.judge(two, set(), set(), set()) == "bad_messages"
    done = fuzz_cases.Outcome(0, "", "")
    assert fuzz_cases.judge(done, set(), {"o/.y.npy.1.ab.tmp"}, {"o"}) == "partial_files"
    # a package whose run gives other bits than the original must be flagged
    monkeypatch.undo()
    tally = fuzz_cases.Tally()
    wrong = fuzz_cases.Fixtures(**{**vars(fixtures), "output_bits": b"other"})
    for seed in range(12):
        fuzz_cases.package_case(wrong, random.Random(seed), work, tally)
    assert tally.invalid_accepted > 0
    assert np.isfinite(fixtures.reference).all()
