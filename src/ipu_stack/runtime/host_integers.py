"""Host-side checks of integer (i32) bindings: int32 or int64 arrays, int64 within int32."""

from __future__ import annotations

import numpy as np

from ipu_stack.errors import IpuStackError


def host_int32(array: np.ndarray, what: str, error: type[IpuStackError]) -> np.ndarray:
    """``array`` as int32 for an i32 binding; messages start with ``what`` (e.g.
    ``"i32 input 'ids'"`` or ``"--input ids"``).

    Raises:
        error: the array is not integer, or an int64 element does not fit in int32 (names
            the binding, the position and the value).
    """
    array = np.asarray(array)
    if array.dtype.kind not in "iu":
        raise error(f"{what}: expected an int32 or int64 array, got {array.dtype}")
    if array.dtype.itemsize > 4 or array.dtype == np.uint32:
        wide = array.astype(np.int64)
        bad = np.flatnonzero((wide < -(2**31)) | (wide > 2**31 - 1))
        if bad.size:
            pos = tuple(int(i) for i in np.unravel_index(int(bad[0]), array.shape))
            raise error(
                f"{what}: value {int(wide.reshape(-1)[bad[0]])} at position {pos} "
                "does not fit in int32"
            )
    return array.astype(np.int32)
