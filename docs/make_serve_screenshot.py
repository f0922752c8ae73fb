"""Make ``docs/serve.png``: ``camkit serve --demo`` in headless Chromium, the image view.

Run from the repository root (needs Chromium and the serve extra)::

    PYTHONPATH=src python docs/make_serve_screenshot.py [docs/serve.png]

The cat photo, Grad-CAM for its top class and for "tabby" side by side, and the depth strip.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from PIL import Image

from camkit.cli import build_parser
from camkit.cli.commands.serve import build
from camkit.serve.app import running

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_report import Browser  # noqa: E402  (the DevTools-pipe driver of the browser test)

WAIT_IDLE = """new Promise((done) => { const t0 = Date.now(); (function poll() {
  if ((document.body.dataset.ready === '1' && document.body.dataset.busy === '0')
      || Date.now() - t0 > 60000) setTimeout(done, 300); else setTimeout(poll, 50); })(); })"""


def shoot(
    out: Path, steps: Callable[[Browser], None], *, extra: Sequence[str] = (), height: int = 980
) -> None:
    """``camkit serve --demo [extra]`` in headless Chromium, on the cat photo once the page is
    idle: ``steps(browser)``, then the page as ``out`` (RGB PNG)."""
    argv = ["serve", "--demo", "--device", "cpu", "--token", "demo", *extra]
    app = build(build_parser().parse_args(argv)).app
    names = [entry.name for entry in app.state.explorer.entries]
    cat = names.index("chelsea.png")
    with running(app) as base, tempfile.TemporaryDirectory() as profile:
        browser = Browser(Path(profile), width=1360, height=height)
        try:
            browser.open(f"{base}/?token=demo#image={cat}")
            browser.js(WAIT_IDLE)
            steps(browser)
            shot = browser.screenshot(out.with_suffix(".tmp.png"))
        finally:
            browser.close()
    Image.open(shot).convert("RGB").save(out, optimize=True)
    shot.unlink()
    print(f"wrote {out}")


def tabby_and_depth(browser: Browser) -> None:
    browser.js(
        """(() => { const e = document.getElementById('class2');
        e.value = 'tabby (281)'; e.dispatchEvent(new Event('change')); })()"""
    )
    browser.js(WAIT_IDLE)
    browser.js("document.getElementById('depth-button').click()")
    browser.js("new Promise((done) => setTimeout(done, 200))")
    browser.js(WAIT_IDLE)


if __name__ == "__main__":
    shoot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/serve.png"), tabby_and_depth)
