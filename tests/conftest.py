"""Suite-wide: builds compile kernels into a private cache, never the user's ~/.cache."""

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    previous = os.environ.get("IPU_KERNEL_CACHE")
    os.environ["IPU_KERNEL_CACHE"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield
    if previous is None:
        os.environ.pop("IPU_KERNEL_CACHE", None)
    else:
        os.environ["IPU_KERNEL_CACHE"] = previous
