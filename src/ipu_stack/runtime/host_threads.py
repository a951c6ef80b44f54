"""The host's BLAS threads during the simulator's kernel semantics.

The GEMM semantics evaluate thousands of small matrix products (one ``[rows, 16] x [16, c]``
K panel each, batched). OpenBLAS splits each across its threads, and on a machine whose
cores are busy the threads' hand-offs dominate: measured on the shared 2-core host, 576
products of 243 x 16 x 144 took 3.0 s with OpenBLAS's default threads under load, 0.21 s
with 2 threads unloaded and 0.054 s with one thread. So the semantics run with one BLAS
thread (the results do not depend on it: each product is one sgemm either way).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import threadpool_limits


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit BLAS libraries to one thread inside the block (restored after it)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield
