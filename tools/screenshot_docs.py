"""Screenshots of the built documentation site, to look at it as a reader would.

    make docs && .venv/bin/python tools/screenshot_docs.py            # site/ -> docs/screenshots/*.png

Serves the built site (``--site``, default ``site/``) on 127.0.0.1 at a free port, and takes a
headless Chromium screenshot of each page in ``PAGES`` (``--page NAME=PATH`` adds others) at
``--window`` size. Needs Chromium (Debian: ``apt-get install chromium``); each run uses a new, empty
profile and never reaches beyond 127.0.0.1 (the site loads nothing from elsewhere: its math is
MathML, its fonts the system's).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: name -> (path under the site, height in pixels, or None for ``--window``'s): the home page,
#: "Getting started" (the README's ten lines and their output), a subpackage's API page (its summary
#: tables), the Table 1 notebook down to its formulas (MathML) and the changelog. A ``#fragment``
#: leaves headless Chromium's screenshot blank, so a page is taken from its top, and taller where what
#: to look at is further down.
PAGES = {
    "home": ("", None),
    "getting-started": ("getting-started/", None),
    "api-strategies": ("api/strategies/", None),
    "notebook-math": ("notebooks/table1_multifidelity/", 2000),
    "changelog": ("changelog/", None),
}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the signature is http.server's
        pass


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no Chromium found: apt-get install -y chromium")


def screenshot(browser: str, url: str, out: Path, window: str, timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="fedgp-chromium-") as profile:
        command = [
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size={window}",
            "--virtual-time-budget=3000",  # let the page's scripts (search, highlighting) settle
            url,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"chromium failed on {url} (exit {done.returncode}):\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site", help="the built site (default site/)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="where the PNGs go")
    parser.add_argument(  # a laptop's width: a code line of 100 characters fits the column from ~1400 px
        "--window", default="1440,1600", help="width,height in pixels (default 1440,1600)"
    )
    parser.add_argument("--page", action="append", default=[], metavar="NAME=PATH", help="another page")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per screenshot")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        raise SystemExit(f"{args.site} holds no built site: run `make docs` first")
    pages = dict(PAGES)
    for item in args.page:
        name, _, path = item.partition("=")
        pages[name] = (path, None)
    browser = chromium()
    handler = functools.partial(_QuietHandler, directory=str(args.site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    written = []
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        width = args.window.split(",")[0]
        for name, (path, height) in pages.items():
            out = args.out / f"{name}.png"
            url = f"http://127.0.0.1:{server.server_port}/{path}"
            window = args.window if height is None else f"{width},{height}"
            screenshot(browser, url, out, window, args.timeout)
            written.append(out)
            print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} ({url})")
    finally:
        server.shutdown()
        server.server_close()
    return written


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
