"""Render a report in headless Chromium: a PNG screenshot of the page and a check that every
figure decoded (index.html counts its loaded images into <body data-images-loaded=...>).

    python -m smallinit.experiments.report.screenshot reports/<name>            # -> reports/<name>/screenshot.png
    python -m smallinit.experiments.report.screenshot reports/<name> --out page.png --width 1280

Needs a Chromium (Debian: apt-get install -y chromium). Offline: the page loads nothing.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from smallinit.core import written
from smallinit.core.errors import ConfigError, first_line

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser() -> str | None:
    return next((p for p in (shutil.which(b) for b in BROWSERS) if p), None)


def _run(browser: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="smallinit-chromium-") as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
               *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def page_info(page: Path, browser: str | None = None, width: int = 1280, timeout: float = 120) -> dict[str, int]:
    """What the page's own load script recorded: images, images decoded, page height [px]."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no chromium found (apt-get install -y chromium)")
    out = _run(browser, [f"--window-size={width},1000", "--dump-dom", page.resolve().as_uri()], timeout)
    info = {}
    for key in ("images", "images-loaded", "height"):
        m = re.search(rf'data-{key}="(\d+)"', out.stdout)
        if m is None:
            raise RuntimeError(f"the page's load script did not run: {out.stderr.strip()[-300:]}")
        info[key] = int(m.group(1))
    return info


def first_screen(page: Path, width: int = 1280, height: int = 800, browser: str | None = None,
                 timeout: float = 120) -> str:
    """The text of what a reader sees before scrolling, in a width x height window: every
    top-level element that starts above the fold, as the page's load script recorded it."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no chromium found (apt-get install -y chromium)")
    out = _run(browser, [f"--window-size={width},{height}", "--dump-dom", page.resolve().as_uri()], timeout)
    m = re.search(r'data-first-screen="([^"]*)"', out.stdout)
    if m is None:
        raise RuntimeError(f"the page's load script did not run: {out.stderr.strip()[-300:]}")
    return html.unescape(m.group(1))


def screenshot(page: Path, out: Path, width: int = 1280, height: int | None = None, browser: str | None = None,
               timeout: float = 120) -> Path:
    """Screenshot of the whole page (height None: as tall as the page says it is)."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no chromium found (apt-get install -y chromium)")
    if height is None:
        height = page_info(page, browser, width, timeout)["height"] + 40
    out = Path(out).resolve()
    written.check(out.parent, [out.name])  # never over a file no command of ours wrote (core/written.py)
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "screenshot.png"
        res = _run(browser, [f"--screenshot={shot}", f"--window-size={width},{height}", page.resolve().as_uri()], timeout)
        if not shot.exists():
            raise RuntimeError(f"chromium wrote no screenshot: {res.stderr.strip()[-300:]}")
        _trim_bottom(shot)
        # Listed in the report folder's .written.json: the next report reads it as its own.
        written.write_outputs(out.parent, {out.name: shot.read_bytes()}, by="smallinit.experiments.report.screenshot",
                              adopt=True)
    return out


def _trim_bottom(path: Path, margin: int = 24) -> None:
    import numpy as np
    from PIL import Image

    img = Image.open(path).convert("RGB")
    a = np.asarray(img)
    rows = np.where((a < 250).any(axis=(1, 2)))[0]
    if len(rows):
        img.crop((0, 0, img.width, min(img.height, int(rows[-1]) + margin))).save(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smallinit.experiments.report.screenshot", description=__doc__.split("\n")[0])
    p.add_argument("report", help="a report folder (reports/<name>) or its index.html")
    p.add_argument("--out", help="PNG to write (default: <report>/screenshot.png)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, help="height to capture [px] (default: the whole page)")
    a = p.parse_args(argv)
    page = Path(a.report)
    page = page / "index.html" if page.is_dir() else page
    if not page.exists():
        print(f"error: {page} does not exist (build it with `make report`)", file=sys.stderr)
        return 2
    browser = find_browser()
    if browser is None:
        print("error: no chromium found; install it (Debian: apt-get install -y chromium)", file=sys.stderr)
        return 2
    try:
        info = page_info(page, browser, a.width)
    except RuntimeError as e:  # a page without a report's load script, or a browser that could not load it
        print(f"error: {page}: {first_line(e)} (is it a report's index.html? `make report` builds one)", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired:
        print(f"error: {page}: {browser} did not load it within 120 s", file=sys.stderr)
        return 2
    try:
        out = screenshot(page, Path(a.out) if a.out else page.parent / "screenshot.png", a.width,
                         a.height or info["height"] + 40, browser)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{info['images-loaded']}/{info['images']} figures rendered, page {a.width}x{info['height']} px; screenshot: {out}")
    return 0 if info["images-loaded"] == info["images"] else 1


if __name__ == "__main__":
    sys.exit(main())
