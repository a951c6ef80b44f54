"""The exception hierarchy: user errors, planning failures, tool failures, bad packages."""

from __future__ import annotations


class IpuStackError(Exception):
    """Base class of every error ipu-stack raises on purpose."""

    #: exit code the CLI uses for this error
    exit_code = 1


class GraphError(IpuStackError):
    """The user's graph or arguments are invalid (bad shape, dtype, argument)."""

    exit_code = 2


class PlanError(IpuStackError):
    """No plan fits: says what did not fit and by how much."""

    exit_code = 2


class PackageError(IpuStackError):
    """A package (or snapshot) file is malformed or corrupt."""

    exit_code = 2


class SimulationError(IpuStackError):
    """The simulator rejected what a program asked of the hardware."""

    exit_code = 1


class ScheduleError(IpuStackError):
    """An exchange schedule violates the hardware model (verifier failure)."""

    exit_code = 1


class InconsistentPackageError(PackageError, SimulationError):
    """A package passed its structural checks but the device rejected its program.

    A ``PackageError`` (exit status 2, the message names the file) that is also a
    ``SimulationError`` (what the simulator reported).
    """

    exit_code = 2


class ToolError(IpuStackError):
    """An external tool failed; carries the tool, exit status, stderr and a repro command."""

    exit_code = 1

    def __init__(self, tool: str, status: int, stderr: str, repro: str) -> None:
        super().__init__(
            f"{tool} exited with status {status}: {stderr.strip()[:400]}\n  repro: {repro}"
        )
        self.tool = tool
        self.status = status
        self.stderr = stderr
        self.repro = repro


class ProfileError(IpuStackError):
    """A profile (``.ipuprof``) file is missing, malformed, corrupt or of another version."""

    exit_code = 2
