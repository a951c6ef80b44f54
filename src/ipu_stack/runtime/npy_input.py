"""Host arrays for a package's bindings: exact dtype and shape, or an explicit cast.

:func:`load_npy_input` reads one ``.npy`` file (the CLI's ``run --input NAME=FILE.npy``) and
:func:`check_array` checks any array against a binding; ``Session.run``/``initialize`` and the
CLI share it. The rules:

- the shape must equal the binding's shape exactly (a transposed or reshaped array with the
  right element count is an error, never silently reshaped);
- the dtype must equal the binding's host dtype (``float16``/``float32``; F8 bindings take
  ``float32`` reals) unless ``cast=True`` (``--cast-inputs``): then booleans, integers and
  floats are converted, and a finite value that overflows the target type is an error;
- the file must be a complete ``.npy`` (not empty, not truncated, not a pickle, not ``.npz``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.runtime.host_integers import host_int32


def check_array(
    what: str, array: object, dtype: np.dtype, shape: Sequence[int], cast: bool = False
) -> np.ndarray:
    """``array`` as the binding's host array, or one line naming the mismatch.

    Args:
        what: how the message names the array (e.g. ``"--input x"``).
        array: the data.
        dtype: the binding's host dtype.
        shape: the binding's shape.
        cast: convert another numeric dtype instead of rejecting it.

    Raises:
        GraphError: wrong shape, wrong dtype (without ``cast``), or a cast that overflows.
    """
    value = np.asarray(array)
    want = tuple(int(d) for d in shape)
    if value.shape != want:
        raise GraphError(f"{what} expects shape {want}, got {value.shape}")
    if value.dtype == dtype:
        return value
    if dtype == np.int32 and value.dtype.kind in "iu":
        # token ids: ONNX declares int64, the device holds int32; every value must fit
        return host_int32(value, what, GraphError)
    if not cast:
        raise GraphError(
            f"{what} expects dtype {dtype}, got {value.dtype} (--cast-inputs / cast=True converts)"
        )
    if value.dtype.kind not in "biuf":
        raise GraphError(f"{what}: dtype {value.dtype} cannot be converted to {dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        converted = value.astype(dtype)
    overflow = np.isfinite(value) & ~np.isfinite(converted) if value.dtype.kind == "f" else None
    if overflow is None and value.dtype.kind in "iu":
        overflow = ~np.isfinite(converted)
    if overflow is not None and overflow.any():
        index = tuple(int(i) for i in np.argwhere(overflow)[0])
        raise GraphError(
            f"{what}: value {value[index]!r} at {index} overflows {dtype} when converted"
        )
    return converted


def load_npy_input(
    what: str, path: str | os.PathLike[str], dtype: np.dtype, shape: Sequence[int], cast: bool
) -> np.ndarray:
    """Read a ``.npy`` file for a binding and check it (see the module docstring).

    Raises:
        GraphError: the file is missing, empty, not a complete ``.npy`` array, or does not
            match (see :func:`check_array`).
    """
    name = os.fspath(path)
    try:
        size = os.path.getsize(name)
        if os.path.isdir(name):
            raise GraphError(f"{what}: {name!r} is a directory, expected a .npy file")
        if size == 0:
            raise GraphError(f"{what}: {name!r} is empty (0 bytes), expected a .npy file")
        with open(name, "rb") as f:
            data = np.load(f, allow_pickle=False)
            if not isinstance(data, np.ndarray):
                raise GraphError(f"{what}: {name!r} is an .npz archive, expected one .npy array")
            if f.read(1):
                raise GraphError(f"{what}: {name!r} has bytes after its array")
    except GraphError:
        raise
    except FileNotFoundError:
        raise GraphError(f"{what}: {name!r} not found") from None
    except OSError as err:
        raise GraphError(f"{what}: cannot read {name!r}: {err.strerror or err}") from None
    except (ValueError, EOFError) as err:  # bad magic, truncated data, pickled objects
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise GraphError(f"{what}: {name!r} is not a valid .npy file: {line}") from None
    return check_array(what, data, dtype, shape, cast)


def check_input_names(given: Iterable[str], expected: Iterable[str], role: str = "input") -> None:
    """Every given name once, and each one a binding of the package.

    Raises:
        GraphError: naming the repeated or unknown name and the package's names.
    """
    known = sorted(expected)
    seen: set[str] = set()
    for name in given:
        if name in seen:
            raise GraphError(f"--{role} {name!r} is given twice")
        seen.add(name)
        if name not in known:
            raise GraphError(
                f"--{role} {name!r}: the package has no {role} {name!r}; its {role}s: "
                f"{', '.join(known) or 'none'}"
            )
