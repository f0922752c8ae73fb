"""Make ``docs/serve_concepts.png``: ``camkit serve --demo`` in headless Chromium, the concept
view of the image view.

Run from the repository root (needs Chromium and the serve extra)::

    PYTHONPATH=src python docs/make_concepts_screenshot.py [docs/serve_concepts.png]

The cat photo, Grad-CAM for its top class at ``blocks.5``, a box dragged over the cat's head:
the four channels of that layer that carry the class there, their shares, their conditional
heatmaps, and the feature visualisation of the first one (computed on demand).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PIL import Image

from camkit.cli import build_parser
from camkit.cli.serve import build
from camkit.serve.app import running

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_report import Browser  # noqa: E402  (the DevTools-pipe driver of the browser test)

WAIT_IDLE = """new Promise((done) => { const t0 = Date.now(); (function poll() {
  if ((document.body.dataset.ready === '1' && document.body.dataset.busy === '0')
      || Date.now() - t0 > 60000) setTimeout(done, 300); else setTimeout(poll, 50); })(); })"""
DRAG = """(() => {
  const img = document.querySelector('#maps img.map'); const r = img.getBoundingClientRect();
  const at = (fx, fy) => ({ clientX: r.left + fx * r.width, clientY: r.top + fy * r.height,
    bubbles: true, button: 0 });
  img.dispatchEvent(new MouseEvent('mousedown', at(0.30, 0.12)));
  window.dispatchEvent(new MouseEvent('mousemove', at(0.72, 0.55)));
  window.dispatchEvent(new MouseEvent('mouseup', at(0.72, 0.55)));
})()"""
FEATURE_SHOWN = """new Promise((done) => { const t0 = Date.now(); (function poll() {
  const i = document.querySelector('#concepts img.feature');
  if ((i && i.complete && i.naturalWidth) || Date.now() - t0 > 120000) setTimeout(done, 300);
  else setTimeout(poll, 50); })(); })"""


def main(out: Path) -> None:
    args = build_parser().parse_args(["serve", "--demo", "--device", "cpu", "--token", "demo"])
    app = build(args).app
    names = [entry.name for entry in app.state.explorer.entries]
    cat = names.index("chelsea.png")
    with running(app) as base, tempfile.TemporaryDirectory() as profile:
        browser = Browser(Path(profile), width=1360, height=1200)
        try:
            browser.open(f"{base}/?token=demo#image={cat}")
            browser.js(WAIT_IDLE)
            browser.js(
                """(() => { const e = document.getElementById('layer');
                e.value = 'blocks.5'; e.dispatchEvent(new Event('change')); })()"""
            )
            browser.js(WAIT_IDLE)
            browser.js("document.getElementById('concept-k').value = '4'")
            browser.js(DRAG)
            browser.js("new Promise((done) => setTimeout(done, 200))")
            browser.js(WAIT_IDLE)
            browser.js("document.querySelector('#concepts button.feature').click()")
            browser.js(FEATURE_SHOWN)
            browser.js("window.scrollTo(0, document.getElementById('maps').offsetTop - 64)")
            browser.js("new Promise((done) => setTimeout(done, 300))")
            shot = browser.screenshot(out.with_suffix(".tmp.png"))
        finally:
            browser.close()
    Image.open(shot).convert("RGB").save(out, optimize=True)
    shot.unlink()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/serve_concepts.png"))
