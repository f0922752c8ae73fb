"""Make ``docs/serve_compare.png``: ``camkit serve --demo --compare-weights`` in headless
Chromium, the image view with both checkpoints and their difference.

Run from the repository root (needs Chromium and the serve extra)::

    PYTHONPATH=src python docs/make_compare_screenshot.py [docs/serve_compare.png]

The second checkpoint is EfficientNet-Lite0 with its classifier's weights shuffled between
classes 281 (tabby) and 285 (Egyptian cat) and a little noise: a stand-in for a fine-tuned
epoch, so that the two disagree on the cat photo.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from camkit import models

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_serve_screenshot import WAIT_IDLE, Browser, shoot  # noqa: E402


def second_checkpoint(folder: Path) -> Path:
    """The default model's weights with two classes swapped and noise on the classifier."""
    state = models.load("efficientnet_lite0").model.state_dict()
    generator = torch.Generator().manual_seed(0)
    for name in ("classifier.weight", "classifier.bias"):
        tensor = state[name].clone()
        tensor[[281, 285]] = tensor[[285, 281]]
        state[name] = tensor + 0.02 * torch.randn(tensor.shape, generator=generator)
    path = folder / "epoch_20.pt"
    torch.save(state, path)
    return path


def both_and_difference(browser: Browser) -> None:
    browser.js("document.getElementById('compare').click()")
    browser.js("new Promise((done) => setTimeout(done, 200))")
    browser.js(WAIT_IDLE)


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        other = second_checkpoint(Path(scratch))
        shoot(out, both_and_difference, extra=["--compare-weights", str(other)], height=1000)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/serve_compare.png"))
