"""Make ``docs/report.png``: the HTML report over scikit-image's photos, in headless Chromium.

Run from the repository root (needs Chromium: ``apt-get install chromium``)::

    PYTHONPATH=src python docs/make_report_screenshot.py [docs/report.png]

Overlays: Grad-CAM and Grad-CAM++ on EfficientNet-Lite0 (ImageNet weights, offline), each
image's top-1 class, each photo made the model's input by the model's own transform (a centre
crop) and its map drawn where the crop lies on the photo, as ``camkit explain`` does.
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

import torch
from PIL import Image
from skimage import data

import camkit
from camkit import io as cio
from camkit import models
from camkit.cli import report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_report import Browser  # noqa: E402  (the DevTools-pipe driver of the browser test)

PHOTOS = {
    "chelsea.jpg": data.chelsea(),
    "coffee.jpg": data.coffee(),
    "astronaut.png": data.astronaut(),
    "rocket.jpg": data.rocket(),
    "motorcycle_left.png": data.stereo_motorcycle()[0],
}
METHODS = {"gradcam": camkit.GradCAM, "gradcam++": camkit.GradCAMPlusPlus}


def explain(root: Path) -> tuple[Path, list[dict]]:
    """The photos written to ``root/photos``, explained into ``root/out``: manifest rows."""
    photos, out = root / "photos", root / "out"
    photos.mkdir()
    out.mkdir()
    net = models.load("efficientnet_lite0")
    records = []
    for name, photo in PHOTOS.items():
        path = photos / name
        Image.fromarray(photo).save(path, **({"quality": 92} if name.endswith(".jpg") else {}))
        image = cio.read_image(path)
        batch = net.preprocess(image)[None]
        with torch.no_grad():
            probabilities = net.model(batch).softmax(-1)[0]
        top5 = [
            {"index": i, "label": label, "probability": p}
            for i, label, p in models.top_classes(probabilities, net.labels, 5)
        ]
        target = top5[0]["index"]
        for method, cls in METHODS.items():
            heat = cls(net.model, net.default_layer)(batch, target=target)[0]
            raw = cls(net.model, net.default_layer)(
                batch, target=target, upsample=False, normalize=False
            )[0]
            stem = f"{path.stem}_{method}_{target}"
            region = net.preprocess.photo_region(*image.shape[:2])
            cio.save_png(out / f"{stem}.png", camkit.viz.overlay_on_photo(image, heat, region))
            cio.save_npy(out / f"{stem}.npy", raw.numpy())
            records.append(
                {
                    "image": str(path),
                    "output": f"{stem}.png",
                    "raw": f"{stem}.npy",
                    "method": method,
                    "layer": net.default_layer,
                    "target": target,
                    "label": net.labels[target],
                    "probability": float(probabilities[target]),
                    "top5": top5,
                    "model": net.name,
                    "size": [image.shape[1], image.shape[0]],
                }
            )
    return out, records


def main(target: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        out, records = explain(Path(folder))
        index = report.write_report(out, records, title="camkit report: scikit-image photos")
        browser = Browser(Path(folder) / "profile", width=1200, height=760)
        try:
            browser.open(index.as_uri())
            browser.js("Promise.all([...document.images].map((i) => i.decode().catch(() => 0)))")
            shot = browser.screenshot(Path(folder) / "shot.png")
        finally:
            browser.close()
        picture = Image.open(shot).convert("RGB")
        buffer = io.BytesIO()
        picture.quantize(
            colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.FLOYDSTEINBERG
        ).save(buffer, "PNG", optimize=True)
        target.write_bytes(buffer.getvalue())
    print(f"wrote {target} ({target.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/report.png"))
