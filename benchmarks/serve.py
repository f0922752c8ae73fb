"""``camkit serve``: what a click costs, timed in one run against the library call and the floor.

    python benchmarks/serve.py [--repeats 5] [--threads 2] [--out benchmarks/SERVE.md]

The default model (EfficientNet-Lite0, 224x224) on scikit-image's five photos; requests go to
the app in this process through httpx's ASGI transport (everything but the socket: routing,
the token check, the batcher, the model thread, the overlay and its PNG). Cases:

1. a new class on an image, request to PNG, vs one ``GradCAM(model, "bn2")(x, target=c)``
   call and the floor (a plain ``torch.inference_mode()`` forward of the same image);
2. 16 concurrent clients asking 400 different maps (5 photos x 80 classes) together vs the
   same 400 requests one at a time;
3. the depth strip (Grad-CAM at the 5 stages, one pass) vs one Grad-CAM call;
   a concept view (the top-5 concepts of ``bn2`` at a click, ``/api/concepts``: the list the
   page shows first) vs one map request, and one concept's conditional heatmap
   (``/api/concept-map``, each fetched as its card appears) likewise;
4. a gallery page of 50 images out of 10,000 once predictions exist (JSON), sorted by
   confidence, and the page's 50 thumbnails: made during prediction (as the background pass
   does), and not made yet.

Medians of ``--repeats`` interleaved rounds. Not a test: a missed target is written, not raised.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

import camkit
from camkit import models
from camkit.cli.commands.demo import demo_photos
from camkit.serve.app import create_app
from camkit.serve.explorer import Explorer
from camkit.serve.gallery import Entry

TOKEN = "bench"
NOTES = """Notes:

- Absolute times depend on the machine's load (its load average at the end of the run is in
  the first line); the ratios compare runs interleaved under the same load.
- The depth strip misses its target: its backward pass must reach the first stage (112x112 in
  EfficientNet-Lite0), while one Grad-CAM at `bn2` back-propagates through the head only; one
  pass for 5 layers still costs less than two separate Grad-CAM calls at the deepest and the
  shallowest stage would.
- The concept view answers with the list (one forward, one backward to the layer: about one
  map request); each concept's conditional heatmap is one more backward to the input (the
  whole network, where Grad-CAM at `bn2` goes through the head only), fetched as its card
  appears. Each heatmap timed is a new one (another concept or class), not the cached answer.
- A lone map request goes to the model at once; requests that arrive together wait 5 ms for
  the rest of them (the 400 concurrent maps).
- Thumbnails are made when an image is predicted (the background pass over the gallery does it
  for every image), so a page of thumbnails is served from memory; a page viewed before that
  pass reached it makes its thumbnails from the decoded photos."""


def make(entries: list[Entry], photos: dict) -> tuple[Explorer, object]:
    loaded = models.load(models.DEFAULT_MODEL)
    for entry in entries:  # decoded once (shared arrays), as a warm server has them
        entry.pixels = photos[entry.name.split("#")[0]]
    explorer = Explorer({"a": loaded}, entries)
    return explorer, create_app(explorer, token=TOKEN)


def median_time(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def fetch(client: httpx.AsyncClient, path: str, **params: object) -> bytes:
    reply = await client.get(path, params={**params, "token": TOKEN})
    reply.raise_for_status()
    return reply.content


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).with_name("SERVE.md")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    photos = {f"{name}.png": photo for name, photo in demo_photos().items()}
    names = list(photos)
    explorer, app = make([Entry(name, Path(name)) for name in names], photos)
    model = explorer.checkpoints["a"].model
    transport = httpx.ASGITransport(app=app)
    rows: list[tuple[str, float, str, float, str, bool]] = []
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")
    x = explorer.model_input(0)
    gradcam = camkit.GradCAM(model, explorer.default_layer)

    # warm-up: every path once
    run(fetch(client, "/api/map", image=0, **{"class": 1}))
    gradcam(x, target=1)
    run(fetch(client, "/api/depth", image=0, **{"class": 1}))
    run(fetch(client, "/api/concepts", image=0, k=5, x=0.5, y=0.5, **{"class": 1}))

    classes = iter(range(2, 1000))

    def new_class() -> None:
        run(fetch(client, "/api/map", image=0, **{"class": next(classes)}))

    def one_gradcam() -> None:
        gradcam(x, target=next(classes))

    def floor() -> None:
        with torch.inference_mode():
            model(x[None])

    def depth() -> None:
        run(fetch(client, "/api/depth", image=0, **{"class": next(classes)}))

    asked: list[dict] = []  # the last concept view's concepts: each heatmap is a new one

    async def concept_list(target: int) -> None:
        where = {"image": 0, "class": target}
        answer = json.loads(await fetch(client, "/api/concepts", k=5, x=0.5, y=0.5, **where))
        asked[:] = [where | {"channel": concept["channel"]} for concept in answer["concepts"]]

    def concept_view() -> None:
        run(concept_list(next(classes)))

    def concept_heatmap() -> None:
        run(fetch(client, "/api/concept-map", **asked.pop()))

    cases = ("serve", "gradcam", "floor", "depth", "concepts", "heatmap")
    timings: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(args.repeats):  # interleaved rounds: a busy machine slows all alike
        for name, function in (
            ("serve", new_class),
            ("gradcam", one_gradcam),
            ("floor", floor),
            ("depth", depth),
            ("concepts", concept_view),
            ("heatmap", concept_heatmap),
        ):
            timings[name].append(median_time(function, 3))
    serve, single, bottom, strip, concepts, heatmap = (
        statistics.median(timings[k]) for k in timings
    )
    rows.append(
        (
            "a new class on an image, request to PNG",
            serve,
            "one Grad-CAM call",
            serve / single,
            "<= 1.3x",
            serve / single <= 1.3,
        )
    )
    rows.append(("", serve, "floor: torch.inference_mode() forward", serve / bottom, "", True))
    rows.append(
        (
            f"depth strip, Grad-CAM at {len(explorer.stages)} stages, one pass",
            strip,
            "one Grad-CAM call",
            strip / single,
            "<= 1.5x",
            strip / single <= 1.5,
        )
    )

    rows.append(
        (
            "a concept view: the top-5 concepts at a click (shares, references)",
            concepts,
            "a new class on an image (one map request)",
            concepts / serve,
            "<= 1.5x",
            concepts / serve <= 1.5,
        )
    )
    rows.append(
        (
            "one concept's conditional heatmap (one backward to the input)",
            heatmap,
            "a new class on an image (one map request)",
            heatmap / serve,
            "",
            True,
        )
    )

    # 400 different maps: 16 clients at once vs one at a time
    pairs = [(image, 100 + c) for image in range(len(names)) for c in range(80)]

    async def one_at_a_time() -> None:
        for image, target in pairs:
            await fetch(client, "/api/map", image=image, **{"class": target})

    async def together() -> None:
        async def one_client(k: int) -> None:
            for image, target in pairs[k::16]:
                await fetch(client, "/api/map", image=image, **{"class": target})

        await asyncio.gather(*(one_client(k) for k in range(16)))

    explorer.maps.clear()
    started = time.perf_counter()
    run(one_at_a_time())
    alone = time.perf_counter() - started
    explorer.maps.clear()
    calls = explorer.engine_calls
    started = time.perf_counter()
    run(together())
    gathered = time.perf_counter() - started
    batches = explorer.engine_calls - calls
    print(f"400 maps: one at a time {alone:.1f} s, 16 clients {gathered:.1f} s ({batches} calls)")
    rows.append(
        (
            f"400 maps from 16 concurrent clients ({batches} engine calls)",
            gathered,
            "the 400 requests one at a time",
            alone / gathered,
            ">= 1.5x faster",
            alone / gathered >= 1.5,
        )
    )

    # the gallery: 10,000 images, predictions known
    many = [Entry(f"{names[k % 5]}#{k}", Path(names[k % 5])) for k in range(10_000)]
    big, big_app = make(many, photos)
    big.predict(list(range(5)), "a")
    known = big.predictions["a"]
    for k in range(5, 10_000):
        index, label, p = known[k % 5][0]
        known[k] = [(index, label, p * (0.5 + (k % 997) / 1994))]
    big_client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=big_app), base_url="http://127.0.0.1"
    )
    offsets = iter(range(0, 10_000, 50))

    def gallery_page() -> None:
        run(fetch(big_client, "/api/gallery", offset=next(offsets), limit=50, order="confidence"))

    def thumbnails() -> None:
        start = next(offsets)

        async def all_thumbs() -> None:
            await asyncio.gather(
                *(fetch(big_client, f"/api/thumb/{i}") for i in range(start, start + 50))
            )

        run(all_thumbs())

    page = median_time(gallery_page, args.repeats)
    thumbs = median_time(thumbnails, args.repeats)
    big.predict(list(range(500)), "a")  # what the background prediction pass leaves

    def thumbnails_made() -> None:
        start = 50 * (next(offsets) % 10)

        async def all_thumbs() -> None:
            paths = [f"/api/thumb/{i}" for i in range(start, start + 50)]
            await asyncio.gather(*(fetch(big_client, path) for path in paths))

        run(all_thumbs())

    made = median_time(thumbnails_made, args.repeats)
    rows.append(
        (
            "gallery page of 50 of 10,000 images, sorted by confidence (JSON)",
            page,
            "target 300 ms",
            page / 0.3,
            "<= 1x",
            page <= 0.3,
        )
    )
    rows.append(
        (
            "the page's 50 thumbnails, made while predicting (background pass)",
            made,
            "target 300 ms",
            made / 0.3,
            "<= 1x",
            made <= 0.3,
        )
    )
    rows.append(
        (
            "the page's 50 thumbnails, none made yet (decoded photos)",
            thumbs,
            "target 300 ms",
            thumbs / 0.3,
            "<= 1x",
            thumbs <= 0.3,
        )
    )
    loop.run_until_complete(client.aclose())
    loop.run_until_complete(big_client.aclose())
    app.state.batcher.close()
    big_app.state.batcher.close()

    lines = [
        "# camkit serve: benchmark",
        "",
        f"`python benchmarks/serve.py` on {datetime.date.today()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{args.threads} threads, load average {os.getloadavg()[0]:.1f}, "
        f"median of {args.repeats} interleaved rounds; "
        "EfficientNet-Lite0 at 224x224 on scikit-image's photos; requests through httpx's ASGI "
        "transport in the same process.",
        "",
        "| case | time | compared with | ratio | target | met |",
        "| --- | ---: | --- | ---: | --- | --- |",
    ]
    for case, seconds, other, ratio, target, met in rows:
        lines.append(
            f"| {case} | {seconds * 1000:.0f} ms | {other} | {ratio:.2f} | {target} | "
            f"{('yes' if met else 'no') if target else ''} |"
        )
    text = "\n".join(lines) + "\n\n" + NOTES + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
