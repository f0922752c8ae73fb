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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_serve_screenshot import WAIT_IDLE, Browser, shoot  # noqa: E402

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


def box_over_the_head(browser: Browser) -> None:
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


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/serve_concepts.png")
    shoot(out, box_over_the_head, height=1200)
