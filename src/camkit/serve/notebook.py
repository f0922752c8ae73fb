"""The explorer inside a notebook: :func:`explore` starts ``camkit serve``'s app in a background
thread on loopback, and the object it returns shows the page inline (an ``<iframe>``, Captum
Insights' way)."""

from __future__ import annotations

import contextlib
import html
import os
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from camkit import io, models
from camkit.core.trace import last_spatial_map, trace
from camkit.errors import ArgumentError
from camkit.models.load import class_names
from camkit.models.vlm import HF_PREFIX, LoadedVLM, load_vlm
from camkit.serve import clips, security, web_stack_missing
from camkit.serve.gallery import Entry
from camkit.serve.launch import Gallery, app_for, open_gallery, url_of
from camkit.serve.sockets import bind, serve_in_thread

LOOPBACK = "127.0.0.1"


class Exploration(contextlib.AbstractContextManager):
    """A running explorer at ``url`` (with its token), shown inline by a notebook (an
    ``<iframe>`` of ``height`` pixels); :meth:`stop` or leaving a ``with`` block ends it."""

    def __init__(self, server: Any, thread: threading.Thread, url: str, height: int) -> None:
        self.server, self.thread, self.url, self.height = server, thread, url, height

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def _repr_html_(self) -> str:
        if not self.running:
            return "<p>camkit explorer: stopped</p>"
        src = html.escape(self.url, quote=True)
        return (
            f'<iframe src="{src}" width="100%" height="{self.height}" '
            'style="border: 1px solid #d8dde3; border-radius: 6px" '
            'title="camkit explorer"></iframe>'
            f'<p><a href="{src}" target="_blank" rel="noopener">open the explorer in a tab</a> '
            "(this machine only; <code>.stop()</code> ends it)</p>"
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Exploration({state}, url={self.url!r})"

    def stop(self) -> None:
        """Stop the server and wait for its thread (the model is left as it was)."""
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def as_loaded(
    model: nn.Module | models.LoadedModel | str,
    *,
    labels: str | os.PathLike[str] | Sequence[str] | None,
    input_size: int | tuple[int, int] | None,
    layer: str | None,
    preprocess: models.Preprocess | None = None,
) -> models.LoadedModel:
    """What :func:`explore` is given as a model -> a :class:`~camkit.models.LoadedModel`: a
    name or checkpoint through :func:`camkit.models.load`; a module with the preprocessing it
    carries (or ``preprocess``), its default layer and ``class <i>`` names unless given."""
    if isinstance(model, models.LoadedModel):
        return model
    if isinstance(model, (str, os.PathLike)):
        return models.load(model, labels=labels)
    if not isinstance(model, nn.Module):
        raise ArgumentError(
            f"expected a torch.nn.Module, a camkit LoadedModel or a model name, got "
            f"{type(model).__name__}"
        )
    preprocess = preprocess or models.preprocess_of(model, input_size)
    calls, output = trace(model, preprocess.size)
    classes = output.shape[1] if isinstance(output, Tensor) and output.ndim == 2 else 0
    return models.LoadedModel(
        name=type(model).__name__,
        model=model,
        preprocess=preprocess,
        labels=class_names(classes, labels),
        default_layer=layer or last_spatial_map(calls, model, preprocess.size),
        input_size=preprocess.size,
    )


def gallery_of(images: object, suffixes: Collection[str] = io.IMAGE_SUFFIXES) -> Gallery:
    """Paths (files, folders, a ``camkit explain`` run) or pictures in memory (arrays, tensors,
    PIL images) -> the gallery; ``suffixes``: the files a folder lists."""
    if isinstance(images, (str, os.PathLike)):
        images = [images]
    if isinstance(images, (list, tuple)) and all(isinstance(i, (str, os.PathLike)) for i in images):
        return open_gallery([Path(i) for i in images], None, None, suffixes=suffixes)
    pictures = list(images) if isinstance(images, (list, tuple)) else [images]
    if not pictures:
        raise ArgumentError("expected images: paths, a folder, a run folder, or pictures")
    entries = [
        Entry(f"image {k}", None, None, io.to_rgb_uint8(picture))
        for k, picture in enumerate(pictures)
    ]
    return Gallery(entries)


def explore(
    model: nn.Module | models.LoadedModel | str,
    images_or_run: object,
    *,
    labels: str | os.PathLike[str] | Sequence[str] | None = None,
    compare: nn.Module | models.LoadedModel | None = None,
    input_size: int | tuple[int, int] | None = None,
    layer: str | None = None,
    port: int = 0,
    height: int = 760,
) -> Exploration:
    """The explorer of ``camkit serve`` for ``model`` on ``images_or_run`` (image files, folders,
    a ``camkit explain`` run folder, or pictures in memory), in a background thread on
    127.0.0.1 with a fresh token; display the result in a notebook to see it inline.

    ``model``: a module (fed as :func:`~camkit.models.preprocess_of` says; ``input_size``:
    another size; ``layer``: its CAM layer, default ``camkit layers``' mark), a
    :class:`~camkit.models.LoadedModel`, a name for :func:`camkit.models.load`, or a
    vision-language model (``"hf:FOLDER"`` or a :class:`~camkit.models.vlm.LoadedVLM`: the page
    then has a prompt box); ``labels``: class names (a list or a file); ``compare``: a second
    checkpoint of the same model; ``port``: 0 for a free one. The model is used as it is. A
    video model (with a ``clip_length``) lists videos and plays maps per frame.

    >>> view = camkit.explore(model, "photos/")   # doctest: +SKIP
    >>> view                                      # the page, inline
    >>> view.stop()
    """
    missing = web_stack_missing()
    if missing:
        raise ArgumentError(missing)
    from camkit.serve.prompts import image_side

    vlm = model if isinstance(model, LoadedVLM) else None
    if isinstance(model, str) and model.startswith(HF_PREFIX):  # as camkit serve loads it
        vlm = load_vlm(model.removeprefix(HF_PREFIX))
    if vlm is not None and compare is not None:
        raise ArgumentError("compare= is for two checkpoints of a classifier, not a VLM")
    if vlm is not None:
        first = image_side(vlm)
    else:
        first = as_loaded(model, labels=labels, input_size=input_size, layer=layer)
    checkpoints = {"a": first}
    if compare is not None:
        checkpoints["b"] = as_loaded(
            compare, labels=first.labels, input_size=None, layer=layer, preprocess=first.preprocess
        )
    gallery = gallery_of(images_or_run, clips.suffixes(first.clip_length))
    reference = next(first.model.parameters(), None)
    device = reference.device if reference is not None else torch.device("cpu")
    token = security.new_token()
    frames = security.NOTEBOOK_FRAMES
    app = app_for(gallery, checkpoints, device, LOOPBACK, token, frame_ancestors=frames, vlm=vlm)
    sock = bind(LOOPBACK, port)
    server, thread = serve_in_thread(app, sock, "camkit-explore")
    return Exploration(server, thread, url_of(LOOPBACK, sock.getsockname()[1], token), height)
