"""The kernel commands of the ``ipu-stack`` CLI: kernel-compile, kernel-build-id, kernel-flags."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from ipu_stack.errors import GraphError

COMMANDS = ("kernel-compile", "kernel-build-id", "kernel-flags")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the kernel commands on the CLI's sub-parsers."""
    kc = sub.add_parser(
        "kernel-compile",
        help="preflight a kernel source and compile it (Poplar SDK) or check it, via the cache",
        description="Example: ipu-stack kernel-compile gemm_amp.S --name N -- $(ipu-stack "
        "kernel-flags N)",
    )
    kc.add_argument("source", metavar="SOURCE", help="assembly template (.S)")
    kc.add_argument("--name", default=None, help="unit name (default: the file stem)")
    kc.add_argument(
        "--sdk", default=None, help="Poplar SDK root (default: $POPLAR_SDK_ENABLED; none: check)"
    )
    kc.add_argument("--json", action="store_true", help="print one JSON object")
    # Everything after SOURCE: options, then `--` and the compile flags (argparse alone would
    # take -D... for options, or options for flags).
    kc.add_argument("rest", nargs=argparse.REMAINDER, metavar="[OPTIONS] -- FLAGS")
    bid = sub.add_parser("kernel-build-id", help="SHA-256 digest of a kernel source tree")
    bid.add_argument("dir", metavar="DIR")
    kf = sub.add_parser("kernel-flags", help="the compile flags of a GEMM unit name")
    kf.add_argument("name", metavar="NAME", help="e.g. gemm_f16_interleaved_k64_c80_r11_r12")
    kf.add_argument("--source", action="store_true", help="print the template path first")


def run(args: argparse.Namespace) -> int:
    """Run a kernel command (``args.command`` in :data:`COMMANDS`)."""
    if args.command == "kernel-build-id":
        from ipu_stack.kernels.cache import tree_digest

        try:
            print(tree_digest(args.dir))
        except NotADirectoryError as err:
            raise GraphError(str(err)) from None
        return 0
    if args.command == "kernel-flags":
        from ipu_stack.kernels.registry import parse_gemm_variant

        variant = parse_gemm_variant(args.name)
        words = [str(variant.source)] if args.source else []
        print(shlex.join(words + variant.flags()))
        return 0
    return _kernel_compile(args)


def _kernel_compile(args: argparse.Namespace) -> int:
    from ipu_stack.kernels.build import KernelBuildError, KernelCompilation, compile_kernels
    from ipu_stack.kernels.cache import KernelCache
    from ipu_stack.kernels.toolchain import Toolchain
    from ipu_stack.trace import Trace, configure_logging

    # argparse drops a `--` that directly follows SOURCE; options before any `--` are ours.
    rest = list(args.rest)
    split = rest.index("--") if "--" in rest else len(rest)
    late = argparse.ArgumentParser(prog="ipu-stack kernel-compile", add_help=False)
    late.add_argument("--name")
    late.add_argument("--sdk")
    late.add_argument("--json", action="store_true")
    extra, unknown = late.parse_known_args(rest[:split])
    flags = unknown + rest[split + 1 :]
    args.name = extra.name or args.name
    args.sdk = extra.sdk or args.sdk
    args.json = extra.json or args.json
    if args.json:
        configure_logging(verbose=False)
    from ipu_stack.kernels.source_check import check_kernel_source

    source = check_kernel_source(args.source)
    unit = KernelCompilation(args.name or source.stem, source, tuple(flags))
    toolchain = Toolchain.discover(args.sdk)
    cache = KernelCache()
    trace = Trace()
    try:
        (artifact,) = compile_kernels([unit], toolchain, cache, trace, jobs=1)
    except KernelBuildError as err:
        sys.stderr.write(err.details.rstrip() + "\n")
        raise
    if args.json:
        print(json.dumps({**artifact.describe(), "cache": cache_word(artifact.cache_hit)}))
        return 0
    print(f"kernel {artifact.name}: cache {cache_word(artifact.cache_hit)}")
    print(f"  entry    {artifact.entry}")
    print(f"  metadata {artifact.metadata}")
    print(f"  object   {artifact.object or 'not assembled (no Poplar SDK: checked source only)'}")
    print(f"  key      {artifact.key}")
    print(f"  symbols  {' '.join(artifact.symbols) or '(none)'}")
    return 0


def cache_word(hit: bool) -> str:
    return "hit" if hit else "miss"
