"""Starting the explorer for ``camkit serve`` (the CLI imports this module only, lazily) and
:func:`camkit.serve.notebook.explore`: the gallery from paths, the app, binding, listening. The
address is bound *before* the URL is printed: a busy port fails in one line
(:class:`~camkit.serve.sockets.BindError`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from camkit import io, models
from camkit.errors import ArgumentError, RunFileError
from camkit.io import IMAGE_SUFFIXES
from camkit.models.vlm import LoadedVLM
from camkit.runs import MANIFEST
from camkit.runs.concepts import CONCEPTS_FILE, read_concepts
from camkit.runs.manifest import read_manifest, recorded_crop, sha256
from camkit.runs.strategies import STRATEGIES_FILE
from camkit.serve import clips, security
from camkit.serve.gallery import Entry, Prediction, RunViews, read_run, read_strategies, scan
from camkit.serve.logs import configure
from camkit.serve.sockets import bind


@dataclass
class Gallery:
    """What a set of paths gives the explorer: the images, and a run folder's views."""

    entries: list[Entry]
    predictions: dict[int, Prediction] | None = None
    run: RunViews = dataclasses.field(default_factory=RunViews)


def check_paths(paths: list[Path]) -> None:
    """Refuse no paths, or a path that does not exist (before any model is loaded)."""
    if not paths:
        raise ArgumentError("give images, folders or a camkit explain run folder, or --demo")
    for path in paths:
        if not path.exists():
            raise ArgumentError(f"no such file or directory: {path}")


def run_crop(paths: Sequence[Path]) -> str | None:
    """The ``--crop`` a ``camkit explain`` run folder was made with, so that the explorer
    preprocesses its photos as the run did; None for images."""
    if len(paths) == 1 and (paths[0] / MANIFEST).is_file():
        return read_manifest(paths[0]).crop
    return None


def check_start(paths: list[Path], host: str, token: str | None) -> str:
    """Refuse, before any model is loaded, bad paths and listening on ``host`` without a token
    -> the token (a new one for None; '' for none)."""
    check_paths(paths)
    token = security.new_token() if token is None else token
    security.check_bind(host, token)
    return token


def open_gallery(
    paths: list[Path],
    model: str | None,
    weights_sha: str | None,
    crop: str | None = None,
    suffixes: Collection[str] = IMAGE_SUFFIXES,
) -> Gallery:
    """Images, folders, or one ``camkit explain`` run folder -> the gallery. A run made by
    another model, other weights or another crop keeps its images and maps but not its
    predictions. A broken strategies or concepts file leaves that view out and is in
    ``run.problems``; a broken manifest is raised. ``suffixes``: the files a folder lists."""
    check_paths(paths)
    if len(paths) == 1 and (paths[0] / MANIFEST).is_file():
        root = paths[0].resolve()
        entries, header, predictions = read_run(root)
        problems: dict[str, str] = {}
        try:
            strategies = read_strategies(root, entries)
        except RunFileError as broken:
            strategies, problems[STRATEGIES_FILE] = None, str(broken)
        try:
            concepts = read_concepts(root)
        except RunFileError as broken:
            concepts, problems[CONCEPTS_FILE] = None, str(broken)
        recorded = recorded_crop(header)
        made_by = (header.get("model"), header.get("weights_sha256"), recorded)
        if made_by != (model, weights_sha, crop or recorded):
            predictions = {}  # made by another model or preprocessing: predict again
        header = {key: header.get(key) for key in ("model", "settings", "started", "camkit")}
        run = RunViews(root, header, strategies, concepts, problems)
        gallery = Gallery(entries, predictions, run)
    else:
        gallery = Gallery(scan(paths, suffixes)[0])
    if not gallery.entries:
        raise ArgumentError(f"no images found in {', '.join(map(str, paths))}")
    return gallery


def checkpoint_names(model: str, weights: Sequence[str | None]) -> dict[str, str]:
    """The page's name of each checkpoint (keys ``a``, ``b``...): its file's name, or its path
    when two files share a name; ``MODEL (its own weights)`` for none."""
    files = [None if w is None else Path(w) for w in weights]
    names = [f.name if f is not None else f"{model} (its own weights)" for f in files]
    if len(set(names)) < len(names):
        names = [str(f) if f is not None else n for f, n in zip(files, names, strict=True)]
    return {chr(ord("a") + k): name for k, name in enumerate(names)}


def url_of(host: str, port: int, token: str | None) -> str:
    """The URL a browser opens (the token in its query when there is one)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


@dataclass
class Prepared:
    """An app ready to listen: the app, its token ('' or None: none) and its image count."""

    app: Any
    token: str | None
    count: int


def prepare(
    paths: list[Path],
    checkpoints: dict[str, models.LoadedModel],
    *,
    model: str,
    weights: str | None,
    device: torch.device,
    host: str,
    token: str,
    names: dict[str, str] | None = None,
    max_pixels: int | None = io.MAX_PIXELS,
    vlm: LoadedVLM | None = None,
) -> Prepared:
    """Read the gallery and build the app, once :func:`check_start` has checked the paths, the
    address and the token ('' for none). ``names``: each checkpoint's name on the page;
    ``max_pixels``: the largest image read (None: any); ``vlm``: a vision-language model, whose
    image side the explorer then shows instead of ``checkpoints``."""
    from camkit.serve.prompts import image_side

    if vlm is not None:
        checkpoints = {"a": image_side(vlm)}
    first = next(iter(checkpoints.values()))
    suffixes = clips.suffixes(first.clip_length)
    crop = first.preprocess.crop_mode
    gallery = open_gallery(paths, model, sha256(weights), crop, suffixes)
    for problem in gallery.run.problems.values():
        print(f"camkit serve: warning: {problem}", file=sys.stderr)
    app = app_for(
        gallery, checkpoints, device, host, token or None, max_pixels, names=names, vlm=vlm
    )
    return Prepared(app, token, len(gallery.entries))


def app_for(
    gallery: Gallery,
    checkpoints: dict[str, models.LoadedModel],
    device: torch.device,
    host: str,
    token: str | None,
    max_pixels: int | None = io.MAX_PIXELS,
    **options: Any,
) -> Any:
    """The explorer of ``gallery`` and its app, predicting in the background and taking the
    ``Host`` headers of ``host`` (``options``: :func:`~camkit.serve.app.create_app`'s)."""
    from camkit.serve.app import create_app
    from camkit.serve.explorer import Explorer

    explorer = Explorer(
        checkpoints,
        gallery.entries,
        predictions=gallery.predictions,
        device=device,
        max_pixels=max_pixels,
    )
    hosts = security.allowed_hosts(host)
    return create_app(
        explorer, token=token, hosts=hosts, background=True, run=gallery.run, **options
    )


def listen(
    prepared: Prepared,
    host: str,
    port: int,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> None:
    """Bind ``host:port`` (:class:`~camkit.serve.sockets.BindError` when it cannot), then print
    the URL and serve until interrupted, logging each request (:mod:`camkit.serve.logs`)."""
    import uvicorn

    sock = bind(host, port)
    try:
        configure()
        config = uvicorn.Config(prepared.app, log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        bound = sock.getsockname()[1]
        say(f"camkit serve: {prepared.count} images; open {url_of(host, bound, prepared.token)}")
        server.run(sockets=[sock])
    finally:
        sock.close()
