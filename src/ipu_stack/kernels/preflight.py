"""Preflight: check a kernel variant's assembly before any external tool sees it.

Stages, as the real toolchain runs them:

1. **C preprocessing** with the system C preprocessor (``cpp``, else ``gcc -E``), in
   assembler-with-cpp mode, with the variant's ``-D``/``-U``/``-I`` flags and the target's
   predefined macros (``__IPU__``, ``__IPU_ARCH_VERSION__=21``, facts §19.1). Its line
   markers map every output line to a template file:line, and name every included file.
2. **Assembler macro expansion** by our own expander: ``.macro``/``.endm`` with arguments,
   defaults, ``\\@`` and ``\\()``; ``.set``/``.equ``/``.equiv``/``=``; ``.if`` family with
   ``.elseif``/``.else``/``.endif``; ``.rept``/``.irp``/``.irpc``/``.endr``; ``.error``.
3. **Symbol table and checks**: duplicate definitions (both sites, with the macro
   instantiation chain that produced each), uses of undefined local ``.L`` labels, unbalanced
   macros, loops, conditionals and bundles, unknown mnemonics and malformed operands for the
   instructions in :mod:`ipu_stack.kernels.isa`, instructions in the wrong context
   (floating point in supervisor code, ``runall`` in worker code).

What it does not check: encodings, instruction timing, bundle pairing rules beyond "at most
two instructions", branch ranges, section layout. Those need ``popc``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ipu_stack.errors import IpuStackError
from ipu_stack.kernels.asm_expand import Expansion, Issue, Site, Symbol, display_path, expand

PREFLIGHT_VERSION = "ipu-stack-preflight-1"
TEMPLATE_INCLUDE_DIR = Path(__file__).parent / "templates" / "include"
TARGET_DEFINES = ("-D__IPU__=1", "-D__IPU_ARCH_VERSION__=21")

_LINEMARKER = re.compile(r'^#\s*(\d+)\s+"((?:[^"\\]|\\.)*)"(.*)$')


class PreflightError(IpuStackError):
    """One or more kernel variants failed preflight; ``details`` has every report."""

    exit_code = 1

    def __init__(self, summary: str, details: str) -> None:
        super().__init__(f"{summary}\n{details}")
        self.summary = summary
        self.details = details


@dataclass(slots=True)
class PreflightResult:
    """Everything preflight learned about one variant."""

    variant: str
    source: Path
    flags: tuple[str, ...]
    preprocessed: str = ""
    preprocessor: str = ""
    includes: list[Path] = field(default_factory=list)
    expansion: Expansion = field(default_factory=Expansion)

    @property
    def issues(self) -> list[Issue]:
        return self.expansion.issues

    @property
    def symbols(self) -> dict[str, Symbol]:
        return self.expansion.symbols

    @property
    def ok(self) -> bool:
        return not self.issues

    @property
    def defined_globals(self) -> list[str]:
        return [g for g in self.expansion.globals if g in self.symbols]

    @property
    def externals(self) -> list[str]:
        return self.expansion.externals

    def report(self) -> str:
        """Every problem of this variant, one per item, with template file:line sites."""
        count = len(self.issues)
        head = (
            f"kernel {self.variant} ({display_path(str(self.source))}): "
            f"{count} problem{'s' if count != 1 else ''}"
        )
        return "\n".join([head, *(f"  - {i.describe()}" for i in self.issues)])

    def expanded_text(self) -> str:
        """The unit after macro expansion (what an assembler would encode)."""
        return "".join(f"{text}\n" for text, _ in self.expansion.expanded)


# -- 1. C preprocessing ----------------------------------------------------------------------
def find_preprocessor() -> list[str] | None:
    """The C preprocessor command: ``cpp``, else ``gcc -E`` (None when neither exists)."""
    cpp = shutil.which("cpp")
    if cpp:
        return [cpp]
    gcc = shutil.which("gcc") or shutil.which("cc")
    return [gcc, "-E"] if gcc else None


def preprocessor_flags(flags: Sequence[str]) -> list[str]:
    """The subset of compile flags that affect preprocessing (-D, -U, -I, in order)."""
    out, it = [], iter(flags)
    for flag in it:
        if flag in ("-D", "-U", "-I"):
            value = next(it, None)
            if value is not None:
                out.append(flag + value)
        elif flag[:2] in ("-D", "-U", "-I"):
            out.append(flag)
    return out


def preprocess(source: Path, flags: Sequence[str]) -> tuple[str, str, list[str], str]:
    """Run the C preprocessor on ``source``.

    Returns:
        (output text, stderr, command, tool) -- output is empty when the tool failed.

    Raises:
        PreflightError: no C preprocessor is installed.
    """
    command = find_preprocessor()
    if command is None:
        raise PreflightError(
            "no C preprocessor found: install cpp (Debian/Ubuntu: apt-get install cpp)",
            "kernel preflight runs the system C preprocessor, as popc does",
        )
    argv = [
        *command,
        "-x",
        "assembler-with-cpp",
        "-undef",
        "-nostdinc",
        *TARGET_DEFINES,
        f"-I{source.parent}",
        f"-I{TEMPLATE_INCLUDE_DIR}",
        *preprocessor_flags(flags),
        str(source),
    ]
    proc = subprocess.run(argv, capture_output=True, check=False)
    # bytes that are not UTF-8 (a binary include) become U+FFFD; the checks then report them
    out = proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else ""
    return out, proc.stderr.decode("utf-8", "replace"), argv, Path(command[0]).name


def _lines_with_sites(text: str) -> tuple[list[tuple[str, Site]], list[str]]:
    """Pair each output line with its file:line (from line markers); list included files."""
    lines: list[tuple[str, Site]] = []
    files: list[str] = []
    file, line = "<unknown>", 1
    for raw in text.split("\n"):
        m = _LINEMARKER.match(raw)
        if m:
            line, file = int(m[1]), m[2].encode().decode("unicode_escape")
            if not file.startswith("<") and file not in files:
                files.append(file)
            continue
        lines.append((raw, Site(file, line)))
        line += 1
    return lines, files


def included_files(source: Path, flags: Sequence[str]) -> list[Path]:
    """Every file ``source`` includes under ``flags`` (empty if preprocessing fails)."""
    path = source.resolve()
    text, _stderr, _argv, _tool = preprocess(path, flags)
    _, files = _lines_with_sites(text)
    return [Path(f) for f in files if Path(f).resolve() != path]


def preflight(source: Path | str, flags: Sequence[str], variant: str) -> PreflightResult:
    """Preprocess, expand and check one kernel variant; never raises for template faults.

    Args:
        source: the template (``.S``).
        flags: the variant's compile flags (only ``-D``/``-U``/``-I`` matter here).
        variant: the unit name, for reports.

    Returns:
        The result; ``result.ok`` is False when it found problems (``result.issues``).

    Raises:
        PreflightError: no C preprocessor is installed.
    """
    path = Path(source).resolve()
    result = PreflightResult(variant, path, tuple(flags))
    if not path.is_file():
        result.expansion.issues.append(Issue("source", f"source {source} does not exist", ()))
        return result
    text, stderr, _argv, tool = preprocess(path, flags)
    result.preprocessor = tool
    if not text:
        said = stderr.strip().splitlines() or ["preprocessor failed without a message"]
        errors = [line for line in said if re.search(r"\b(error|warning):", line)]
        for line in errors or said:
            result.expansion.issues.append(Issue("preprocessor", f"{tool}: {line.strip()}", ()))
        return result
    result.preprocessed = text
    lines, files = _lines_with_sites(text)
    result.includes = [Path(f) for f in files if Path(f).resolve() != path]
    result.expansion = expand(lines)
    return result


def preflight_all(
    variants: Sequence[tuple[str, Path | str, Sequence[str]]],
) -> list[PreflightResult]:
    """Preflight every ``(name, source, flags)``; raise once, naming every failing variant.

    Raises:
        PreflightError: summary line ``preflight failed for N of M kernel variants: ...``
            and, in ``details``, each failing variant's report.
    """
    results = [preflight(source, flags, name) for name, source, flags in variants]
    raise_for_failures(results)
    return results


def raise_for_failures(results: Sequence[PreflightResult]) -> None:
    failed = [r for r in results if not r.ok]
    if failed:
        names = ", ".join(r.variant for r in failed)
        raise PreflightError(
            f"preflight failed for {len(failed)} of {len(results)} kernel variants: {names}",
            "\n".join(r.report() for r in failed),
        )
