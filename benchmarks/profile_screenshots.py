"""Screenshots of a profile report in headless Chromium (the README's docs/ images).

    python3 benchmarks/profile_screenshots.py PROF.ipuprof --out docs

writes ``profile-timeline.png`` (the timeline) and ``profile-memory.png`` (the tile-memory
heat map). Needs ``chromium`` and Pillow.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from PIL import Image

from ipu_stack.profile import format as profile_format
from ipu_stack.profile.render import write_report

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=20000", "--hide-scrollbars",
)  # fmt: skip


def shoot(page: Path, anchor: str, size: str, out: Path, work: Path) -> None:
    """Screenshot ``page#anchor`` in a fresh browser profile."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed")
    profile_dir = Path(tempfile.mkdtemp(dir=work))
    subprocess.run([chromium, *FLAGS, f"--window-size={size}", f"--user-data-dir={profile_dir}",
                    f"--screenshot={out}", f"{page.as_uri()}#{anchor}"], check=True,
                   capture_output=True, timeout=300)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        page = work / "report.html"
        write_report(profile_format.load(args.profile), page)
        for anchor, size, name in (("timeline-section", "1400,720", "profile-timeline.png"),
                                   ("memory", "1400,620", "profile-memory.png")):  # fmt: skip
            shot = work / name
            shoot(page, anchor, size, shot, work)
            with Image.open(shot) as image:  # palette PNG: a fraction of the size
                image.convert("RGB").quantize(64).save(out / name, optimize=True)
            print(f"wrote {out / name}: {(out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
