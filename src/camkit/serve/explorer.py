"""What the explorer computes, through camkit's public API only: predictions, the methods and
layers that fit a model, maps (many (image, class) pairs of one method in one engine call), the
depth strip, deletion/insertion curves; all on :class:`~camkit.serve.batcher.MapBatcher`'s one
model thread (hooks of two calls must never overlap)."""

from __future__ import annotations

import io as _io
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from camkit import io, metrics, models, registry, viz
from camkit.core.explainer import displayed
from camkit.core.layers import find_layer
from camkit.errors import ArgumentError, InputError, TargetError
from camkit.relevance.composites import COMPOSITES, DEFAULT_COMPOSITE
from camkit.serve import clips
from camkit.serve.cache import LRU
from camkit.serve.gallery import Entry, Prediction

SETTINGS = registry.Settings(composite=DEFAULT_COMPOSITE)


@dataclass(frozen=True)
class MapKey:
    """One map's key: checkpoint, method, layer, image, class, LRP composite (None: none taken)."""

    checkpoint: str
    method: str
    layer: str | None
    image: int
    target: int
    composite: str | None = None


def stages(layers: Sequence[tuple[str, str, tuple]], default: str, count: int = 5) -> list[str]:
    """The depth strip's layers, at most ``count``, deepest last. CNNs: per spatial resolution,
    the last of the shallowest layers there (the end of each stage: ``layer1``..``layer4`` of a
    ResNet), the default layer standing for its own; token models: ``count`` evenly spaced
    layers ending at the default."""
    maps = [(name, shape) for name, _, shape in layers if len(shape) == 4]
    if not maps:
        names = [name for name, _, _ in layers]
        end = names.index(default) + 1 if default in names else len(names)
        picks = np.linspace(0, end - 1, min(count, end)).round().astype(int)
        return [names[i] for i in dict.fromkeys(picks.tolist())]
    ends = {}  # resolution -> its stage's end; deepest first, so the shallowest is written last
    for name, shape in sorted(maps, key=lambda item: -item[0].count(".")):
        ends[tuple(shape[-2:])] = name
    ends.update({tuple(shape[-2:]): name for name, shape in maps if name == default})
    order = [name for name, _ in maps]
    return sorted(ends.values(), key=order.index)[-count:]


class Explorer:
    """One or two checkpoints of one model, the images, and the caches of what was computed.
    ``settings``: how methods are built (:func:`camkit.registry.build`; default: the CLI's),
    so that a map here equals ``camkit explain``'s."""

    def __init__(
        self,
        checkpoints: dict[str, models.LoadedModel],
        entries: list[Entry],
        *,
        predictions: dict[int, Prediction] | None = None,
        device: torch.device | str = "cpu",
        cache_maps: int = 2048,
        settings: registry.Settings = SETTINGS,
        max_pixels: int | None = io.MAX_PIXELS,
    ) -> None:
        if not checkpoints:
            raise ArgumentError("expected at least one model")
        self.checkpoints = checkpoints
        self.device = torch.device(device)
        self.settings = settings
        first = next(iter(checkpoints.values()))
        self.labels = first.labels
        self.size = first.input_size
        self.clip_length = first.clip_length  # a video model's: entries are clips, maps (T, H, W)
        self.preprocess = first.preprocess
        self.default_layer = first.default_layer
        self.entries = entries
        self.max_pixels = max_pixels  # the largest image read, a file or an upload (None: any)
        self.entries_lock = threading.Lock()
        self.predictions: dict[str, dict[int, Prediction]] = {key: {} for key in checkpoints}
        self.predictions[next(iter(checkpoints))].update(predictions or {})
        self.layers = [
            (name, kind, tuple(shape))
            for name, kind, shape in models.map_layer_shapes(first.model, self.size)
        ]
        self.layer_shapes = {name: shape for name, _, shape in self.layers}
        self.stages = stages(self.layers, self.default_layer)
        self.unavailable = {  # why a method does not fit the model: the method's own answer
            name: reason
            for name in registry.METHODS
            if (reason := registry.get(name).cls.fits(first.model)) is not None
        }
        self.methods = [name for name in registry.METHODS if name not in self.unavailable]
        self.maps = LRU(cache_maps)
        self.measured = LRU(cache_maps)  # what a method measured of a map (LRP: conservation)
        held = 256 if self.clip_length is None else clips.VIDEOS_HELD  # a video is large
        self.inputs, self.photos = LRU(held), LRU(held)
        self.thumbs = LRU(4096)
        self.explainers = LRU(32)
        self.engine_calls = 0
        self.row_seconds: float | None = None  # one forward row, measured by predict

    def entry(self, image: int) -> Entry:
        if not 0 <= image < len(self.entries):
            raise KeyError(image)
        return self.entries[image]

    def add_upload(self, name: str, pixels: np.ndarray) -> int:
        """Add an uploaded image; its id."""
        with self.entries_lock:
            self.entries.append(Entry(name, None, None, pixels))
            return len(self.entries) - 1

    def photo(self, image: int) -> np.ndarray:
        """The image as read (``HxWx3`` uint8), a video model's video (``NxHxWx3``,
        :func:`camkit.serve.clips.read`), with camkit's reading limits."""
        return self.photos.fetch(image, lambda: self._read(self.entry(image)))

    def _read(self, entry: Entry) -> np.ndarray:
        if entry.pixels is not None:
            return entry.pixels
        try:
            return clips.read(entry.path, self.clip_length, self.max_pixels)
        except clips.READ_ERRORS as error:
            entry.error = io.read_failure(error)
            raise InputError(f"{entry.name} cannot be read: {entry.error}") from None

    def model_view(self, image: int) -> np.ndarray:
        """What the model sees of the photo (a video: its first frame), resized and cropped."""
        return self.preprocess.resize_crop(clips.shown_frame(self.photo(image)))

    def model_input(self, image: int) -> Tensor:
        return self.inputs.fetch(
            image, lambda: clips.model_input(self.preprocess, self.photo(image), self.clip_length)
        )

    def thumbnail(self, image: int, side: int = 160) -> bytes:
        """A JPEG thumbnail of the photo (cached)."""

        def jpeg() -> bytes:
            return io.encode_image(io.thumbnail(clips.shown_frame(self.photo(image)), side), "jpg")

        return self.thumbs.fetch(image, jpeg)

    def batch(self, images: Sequence[int], checkpoint: str) -> Tensor:
        """The model inputs of ``images`` as one batch on the device, in the model's dtype."""
        model = self.checkpoints[checkpoint].model
        reference = next(model.parameters(), None)
        batch = torch.cat([clips.rows(self.model_input(i)) for i in images]).to(self.device)
        return batch if reference is None else batch.to(dtype=reference.dtype)

    def row_counts(self, images: Sequence[int]) -> list[int]:
        """The rows of each image in :meth:`batch`: 1, a video's windows."""
        return [len(clips.rows(self.model_input(i))) for i in images]

    def predict(self, images: Sequence[int], checkpoint: str, k: int = 5) -> None:
        """Top-``k`` of the images not predicted yet, one forward pass per checkpoint (a video
        model: one per video), and their thumbnails; an unreadable image gets an empty
        prediction and its entry the reason."""
        known = self.predictions[checkpoint]
        todo = [i for i in dict.fromkeys(images) if i not in known]
        readable = []
        for image in todo:
            try:
                self.model_input(image)
                self.thumbnail(image)  # made while the photo is decoded: the gallery is fast
                readable.append(image)
            except InputError:  # the reason is in the entry's error
                known[image] = []
        if not readable:
            return
        started = time.perf_counter()
        groups = [[i] for i in readable] if self.clip_length else [readable]  # a video a pass
        probabilities = torch.cat([self.probabilities_of(group, checkpoint) for group in groups])
        self.row_seconds = (time.perf_counter() - started) / sum(self.row_counts(readable))
        for image, row in zip(readable, probabilities, strict=True):
            known[image] = models.top_classes(row, self.labels, k)

    def probabilities_of(self, images: Sequence[int], checkpoint: str) -> Tensor:
        """All class probabilities of readable images, ``(B, num_classes)``, in one forward pass
        (a video's: the mean of its windows')."""
        model = self.checkpoints[checkpoint].model
        with torch.no_grad():
            logits = model(self.batch(images, checkpoint))
        return clips.per_entry(logits.float().softmax(dim=-1).cpu(), self.row_counts(images))

    def check_target(self, target: int) -> int:
        if not 0 <= target < len(self.labels):
            raise TargetError(
                f"class {target} is out of range: this model has {len(self.labels)} classes, "
                f"0..{len(self.labels) - 1}"
            )
        return target

    def check_method(self, method: str) -> str:
        registry.get(method)  # unknown names: UnknownMethodError with the close ones
        if method in self.unavailable:
            raise ArgumentError(f"{method} does not fit this model: {self.unavailable[method]}")
        return method

    def check_layer(self, layer: str) -> str:
        if layer not in self.layer_shapes:
            find_layer(self.checkpoints[next(iter(self.checkpoints))].model, layer)
            raise ArgumentError(
                f"layer {layer!r} has no (B, C, h, w) map or (B, N, C) tokens to explain; "
                "choose a layer that 'camkit layers' lists with such a shape"
            )
        return layer

    def check_composite(self, method: str, composite: str | None) -> str | None:
        """The LRP composite a map of ``method`` is computed with: ``composite`` or the
        explorer's default; None for a method that takes none."""
        if composite is not None and composite not in COMPOSITES:
            raise ArgumentError(
                f"unknown composite {composite!r}; choose from {', '.join(COMPOSITES)}"
            )
        takes = registry.get(method).takes_composite
        return (composite or self.settings.composite) if takes else None

    def keys(
        self,
        checkpoint: str,
        method: str,
        layers: Sequence[str | None],
        image: int,
        target: int,
        composite: str | None = None,
    ) -> list[MapKey]:
        """The cache keys of one (image, class)'s maps at each of ``layers`` (None: no layer)."""
        layers = layers if registry.get(method).needs_layer else (None,)
        composite = self.check_composite(method, composite)
        return [MapKey(checkpoint, method, layer, image, target, composite) for layer in layers]

    def explainer(
        self,
        checkpoint: str,
        method: str,
        layers: tuple[str, ...],
        composite: str | None = None,
    ) -> object:
        """The method at ``layers`` of ``checkpoint``'s model, built once and kept."""
        composite = self.check_composite(method, composite)
        needs_layer = registry.get(method).needs_layer
        layer = (list(layers) if len(layers) > 1 else layers[0]) if needs_layer else None
        model = self.checkpoints[checkpoint].model
        settings = replace(self.settings, composite=composite)
        return self.explainers.fetch(
            (checkpoint, method, layers, composite),
            lambda: registry.build(method, model, layer, settings),
        )

    def compute(
        self,
        checkpoint: str,
        method: str,
        layers: tuple[str, ...],
        pairs: Sequence[tuple[int, int]],
        composite: str | None = None,
    ) -> None:
        """Maps of one method for many ``(image, class)`` pairs, at one or several layers, in
        ONE call into the cache: the images as one batch, their classes as ``K`` targets (a
        shorter list padded with its last class), all layers from one pass. Pairs cached at
        every layer are skipped (two routes may queue the same map before either computed it)."""
        needs_layer = registry.get(method).needs_layer
        layers = layers if needs_layer else (None,)
        pairs = [
            (image, target)
            for image, target in pairs
            if any(
                self.maps.get_item(key) is None
                for key in self.keys(checkpoint, method, layers, image, target, composite)
            )
        ]
        if not pairs:
            return
        wanted: dict[int, list[int]] = {}
        for image, target in dict.fromkeys(pairs):
            wanted.setdefault(image, []).append(target)
        images = list(wanted)
        width = max(len(classes) for classes in wanted.values())
        targets = torch.tensor([c + [c[-1]] * (width - len(c)) for c in wanted.values()])
        counts = self.row_counts(images)  # a video's windows share its classes
        targets = targets.repeat_interleave(torch.tensor(counts), dim=0)
        explainer = self.explainer(checkpoint, method, layers, composite)
        batch = self.batch(images, checkpoint)
        options = {"fuse": False} if needs_layer and len(layers) > 1 else {}
        self.engine_calls += 1
        shown, _ = displayed(explainer, batch, targets.to(self.device), **options)
        measured = explainer.measured()  # per sample and target, or None
        by_layer = shown if isinstance(shown, dict) else {layers[0]: shown}
        photos = [self.photo(image) for image in images]
        firsts = np.cumsum([0, *counts[:-1]])  # each image's first row (a video's first window)
        for layer, heat in by_layer.items():  # the method's one display policy
            frame = heat.shape[-3:] if self.clip_length else heat.shape[-2:]  # (L,) H, W
            rows = heat.reshape(len(batch), width, *frame)  # (rows, K, [L,] H, W)
            maps = clips.entry_maps(rows, counts, photos, self.clip_length)  # (K, [N,] H, W)
            for row, image in enumerate(images):
                for column, target in enumerate(wanted[image]):
                    (key,) = self.keys(checkpoint, method, (layer,), image, target, composite)
                    self.maps.put(key, maps[row][column])
                    if measured is not None:
                        self.measured.put(key, measured[firsts[row]][column])

    def curves(self, key: MapKey, steps: int = 20) -> dict[str, dict]:
        """Deletion and insertion curves (Petsiuk et al., RISE, BMVC 2018) of a cached map."""
        heat = self.maps.get_item(key)
        if heat is None:
            raise ArgumentError("compute the map first")
        if self.clip_length is not None:
            raise ArgumentError("deletion and insertion curves are for images, not videos")
        model = self.checkpoints[key.checkpoint].model
        x = self.batch([key.image], key.checkpoint)
        maps = torch.from_numpy(heat)[None].to(self.device)
        answer = {}
        for name, curve in (("deletion", metrics.deletion), ("insertion", metrics.insertion)):
            auc, points = curve(model, x, maps, [key.target], steps=steps, return_curves=True)
            answer[name] = {"auc": float(auc[0]), "curve": points[0].cpu().tolist()}
        return answer


def overlay_png(photo: np.ndarray, heat: np.ndarray, alpha: float, colormap: str) -> bytes:
    """The map over the model's view of the photo, PNG (a signed map on its absolute values)."""
    return io.encode_image(viz.overlay(photo, np.abs(heat), alpha=alpha, colormap=colormap))


def npy_bytes(heat: np.ndarray) -> bytes:
    buffer = _io.BytesIO()
    np.save(buffer, heat.astype(np.float32))
    return buffer.getvalue()
