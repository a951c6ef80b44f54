"""Typed command-line values: every argument is checked before any work starts.

Each function here is an ``argparse`` ``type=``: it returns the parsed value or raises
``argparse.ArgumentTypeError`` with one line naming the value and the limit, which the CLI's
parser prints as ``ipu-stack: error: argument --x: ...`` with exit status 2. Commands other
developers add should use these rather than ``int``/``float``/``str``.

Limits: integers and dimensions at most :data:`MAX_DIMENSION` (2^31 - 1, the largest extent a
32-bit address computation can index); seconds at most :data:`MAX_SECONDS` (one day).
:func:`require_storable` rejects a tensor that could not be held in the whole machine's tile
memory, before anything allocates arrays for it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable

from ipu_stack.errors import PlanError
from ipu_stack.outputs import OutputError, check_output_dir, check_output_file
from ipu_stack.target import ipu21

MAX_DIMENSION = 2**31 - 1
MAX_SECONDS = 86_400.0
#: Bytes of tile memory of the whole machine (1,472 tiles x 624 KiB, ipu21.py, facts §4.4).
MACHINE_TILE_MEMORY = ipu21.TILES * (ipu21.TILE_MEMORY_END - ipu21.TILE_MEMORY_BASE)


def positive_int(text: str, what: str = "dimensions must be positive") -> int:
    """A positive integer up to :data:`MAX_DIMENSION`, else one clear line."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{what}, got {value}")
    if value > MAX_DIMENSION:
        raise argparse.ArgumentTypeError(f"{value} is above the limit {MAX_DIMENSION} (2^31 - 1)")
    return value


def bounded_int(low: int, high: int, what: str = "value") -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {what}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be in {low}..{high}, got {value}")
        return value

    return parse


def seed(text: str) -> int:
    """A random seed: an integer in ``0..2^63 - 1`` (what NumPy's generators take)."""
    return bounded_int(0, 2**63 - 1, "seed")(text)


def finite_float(low: float, high: float, what: str = "value") -> Callable[[str], float]:
    """An argparse type: a finite float in ``[low, high]`` (no nan, no inf)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number for {what}, got {text!r}"
            ) from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{what} must be finite and in [{low:g}, {high:g}], got {text}"
            )
        return value

    return parse


def nonnegative_seconds(text: str) -> float:
    """Seconds: finite, in ``[0, MAX_SECONDS]``, else one clear line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"seconds must be finite, >= 0 and at most {MAX_SECONDS:g} (one day), got {text}"
        )
    return value


def share(text: str) -> float:
    """A fraction: finite, in ``[0, 1]``, else one clear line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a fraction must be between 0 and 1, got {text}")
    return value


def shape(text: str) -> tuple[int, ...]:
    """``D,D,..``: positive dimensions, each at most :data:`MAX_DIMENSION`."""
    try:
        return tuple(positive_int(part.strip()) for part in text.split(","))
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: {err}") from None


def named_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=D,D,..``."""
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D,D,..., got {text!r}")
    return name, shape(dims)


def named_file(text: str) -> tuple[str, str]:
    """``NAME=FILE``."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got {text!r}")
    return name, path


def output_file(text: str) -> str:
    """A file the command will write: its directory exists and is writable, it is no directory.

    Checked when the arguments are parsed, so a bad path fails before any build starts.
    """
    try:
        check_output_file(text)
    except OutputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def output_dir(text: str) -> str:
    """A directory the command will write into: it is (or can be created as) a writable dir."""
    try:
        check_output_dir(text)
    except OutputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def require_storable(shapes: Iterable[tuple[str, tuple[int, ...]]], dtype: str) -> None:
    """Reject tensors larger than the whole machine's tile memory, before any array exists.

    Raises:
        PlanError: naming the tensor, its bytes and the limit.
    """
    element = ipu21.precision(dtype).element_bytes
    for name, dims in shapes:
        size = math.prod(dims) * element
        if size > MACHINE_TILE_MEMORY:
            raise PlanError(
                f"{name} {'x'.join(map(str, dims))} ({dtype}) needs {size:.3g} bytes and does not "
                f"fit in tile memory: the IPU21's {ipu21.TILES} tiles x "
                f"{ipu21.TILE_MEMORY_END - ipu21.TILE_MEMORY_BASE} bytes hold "
                f"{MACHINE_TILE_MEMORY} bytes"
            )
