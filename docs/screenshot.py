"""The first screen of `trace report` as a PNG, rendered by headless Chromium (docs/report-first-screen.png).

    python docs/screenshot.py --store quick-store --recipe recipes/quick.yaml \
        --sample-efficiency benchmarks/results/sample_efficiency_mixed.json --out docs/report-first-screen.png

The committed picture was made this way over a store of `trace run recipes/quick.yaml`; rerun it over a
`make demo` store (`--store store --recipe recipes/demo.yaml`) to show the demo's own numbers. Needs `chromium`
(`apt-get install -y chromium`). tests/cli/test_report.py runs it (slow set).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def chromium(*args: str, profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    return subprocess.run(
        [exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout
    )


def screenshot(page: Path, out: Path, *, width: int = 1280, height: int = 900) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        chromium(
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            page.resolve().as_uri(),
            profile=Path(tmp),
        )
    if not out.is_file():
        raise SystemExit(f"chromium wrote no screenshot to {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--recipe")
    ap.add_argument("--sample-efficiency")
    ap.add_argument("--out", type=Path, default=Path("docs/report-first-screen.png"))
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        cmd = [
            sys.executable,
            "-m",
            "trace_cli",
            "report",
            "--store",
            args.store,
            "--out",
            str(page),
            "--json",
        ]
        cmd += ["--recipe", args.recipe] if args.recipe else []
        cmd += ["--sample-efficiency", args.sample_efficiency] if args.sample_efficiency else []
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            return r.returncode
        screenshot(page, args.out, width=args.width, height=args.height)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
