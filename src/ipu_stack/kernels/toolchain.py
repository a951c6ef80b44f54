"""Toolchain driver: popc and pop-objdump when a Poplar SDK is configured, else check only.

With an SDK (``--sdk DIR`` or ``$POPLAR_SDK_ENABLED``, the SDK root that its enable script
exports), a unit is compiled as the reference does (facts §19.2, reference-system §1.9)::

    popc --target ipu21 [-O2 unless a -O flag is given] FLAGS SOURCE -o kernel.gp
    pop-objdump extract ipu21 kernel.gp > kernel.o
    pop-objdump metadata ipu21 kernel.gp > popc-metadata.json

A failing tool raises :class:`~ipu_stack.errors.ToolError` with the tool, its exit status,
its stderr and a command line that reproduces the failure. Without an SDK nothing is
assembled: the unit is preflighted and cached as checked sources with metadata
(``assembled: false``); the simulator does not need objects.
"""

from __future__ import annotations

import os
import shlex
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ipu_stack.errors import ToolError
from ipu_stack.kernels.cache import is_colossus_elf
from ipu_stack.kernels.preflight import PREFLIGHT_VERSION, find_preprocessor

TARGET = "ipu21"


def _file_identity(path: Path) -> bytes:
    """Canonical path, size (u64 LE), mtime seconds (u64 LE) and nanoseconds (u32 LE)."""
    real = path.resolve()
    st = real.stat()
    return (
        str(real).encode()
        + b"\0"
        + struct.pack("<QQI", st.st_size, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9)
    )


@dataclass(frozen=True, slots=True)
class Toolchain:
    """Either an SDK (``popc``, ``pop-objdump``) or check-only mode (``sdk is None``)."""

    sdk: Path | None = None

    @classmethod
    def discover(cls, sdk: str | os.PathLike[str] | None = None) -> Toolchain:
        """``sdk``, else ``$POPLAR_SDK_ENABLED``, else check-only.

        Raises:
            ToolError: an SDK is configured but has no ``bin/popc`` or ``bin/pop-objdump``.
        """
        chosen = sdk if sdk not in (None, "") else os.environ.get("POPLAR_SDK_ENABLED") or None
        if chosen is None:
            return cls(None)
        root = Path(chosen)
        tools = cls(root)
        for tool in (tools.popc, tools.objdump):
            if not os.access(tool, os.X_OK):
                raise ToolError(
                    tool.name,
                    127,
                    f"not found or not executable at {tool} (SDK {root})",
                    f"ls -l {shlex.quote(str(tool))}",
                )
        return tools

    @property
    def assembles(self) -> bool:
        return self.sdk is not None

    @property
    def popc(self) -> Path:
        assert self.sdk is not None
        return self.sdk / "bin" / "popc"

    @property
    def objdump(self) -> Path:
        assert self.sdk is not None
        return self.sdk / "bin" / "pop-objdump"

    def identity(self) -> bytes:
        """What the cache key records about the tools (a new SDK is a new key)."""
        if self.sdk is None:
            cpp = find_preprocessor()
            cpp_id = _file_identity(Path(cpp[0])) if cpp else b"none"
            return f"check-only {PREFLIGHT_VERSION}\0".encode() + cpp_id
        return _file_identity(self.popc) + b"\0" + _file_identity(self.objdump)

    def describe(self) -> dict[str, object]:
        if self.sdk is None:
            cpp = find_preprocessor()
            return {
                "mode": "check-only (no Poplar SDK)",
                "preflight": PREFLIGHT_VERSION,
                "preprocessor": " ".join(cpp) if cpp else None,
            }
        return {"mode": "poplar-sdk", "popc": str(self.popc), "pop-objdump": str(self.objdump)}

    def compile_command(self, source: Path, flags: Sequence[str], output: Path) -> list[str]:
        optimise = [] if any(f.startswith("-O") for f in flags) else ["-O2"]
        return [
            str(self.popc), "--target", TARGET, *optimise, *flags, str(source), "-o", str(output)
        ]  # fmt: skip

    def compile(self, source: Path, flags: Sequence[str], outdir: Path) -> dict[str, float]:
        """popc + pop-objdump into ``outdir``; returns timings in milliseconds.

        Raises:
            ToolError: a tool failed, or produced no Colossus ELF object.
        """
        gp = outdir / "kernel.gp"
        timings = {}
        start = time.perf_counter()
        self._run(self.compile_command(source, flags, gp), "popc")
        timings["popc_ms"] = (time.perf_counter() - start) * 1000
        for what, out in (("extract", "kernel.o"), ("metadata", "popc-metadata.json")):
            start = time.perf_counter()
            command = [str(self.objdump), what, TARGET, str(gp)]
            (outdir / out).write_bytes(self._run(command, "pop-objdump", stdout_to=outdir / out))
            timings[f"objdump_{what}_ms"] = (time.perf_counter() - start) * 1000
        if not is_colossus_elf(outdir / "kernel.o"):
            raise ToolError(
                "pop-objdump",
                0,
                "extract did not produce a little-endian ELF32 object for machine 0xf8",
                shlex.join([str(self.objdump), "extract", TARGET, str(gp)]),
            )
        return timings

    @staticmethod
    def _run(command: list[str], tool: str, stdout_to: Path | None = None) -> bytes:
        repro = shlex.join(command) + (f" > {shlex.quote(str(stdout_to))}" if stdout_to else "")
        try:
            proc = subprocess.run(command, capture_output=True, check=False)
        except OSError as err:
            raise ToolError(tool, 127, str(err), repro) from None
        if proc.returncode != 0:
            stderr = proc.stderr.decode("utf-8", "replace")
            raise ToolError(tool, proc.returncode, stderr, repro)
        return proc.stdout
