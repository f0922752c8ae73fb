"""``camkit explain --model hf:FOLDER --prompt TEXT``: vision-language models from a local
HuggingFace folder. A dual encoder (CLIP, SigLIP) gets an overlay per prompt; a generative
model (LLaVA, PaliGemma, Gemma 3) answers the prompt and gets an overlay per generated token
and an HTML page of the text with the prompt's tokens coloured by their relevance to each."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from camkit import io, registry
from camkit.cli import report
from camkit.cli.arguments import positive_int
from camkit.cli.common import (
    UsageError,
    check_colormap,
    check_run_inputs,
    exit_status,
    wants_report,
)
from camkit.core.explainer import Explainer, displayed
from camkit.errors import CamkitError, InputError
from camkit.methods.cam.base import BaseCAM
from camkit.methods.cam.generation import explain_answer
from camkit.models.vlm import HF_PREFIX, LoadedVLM, load_vlm
from camkit.runs.manifest import header, write_manifest
from camkit.targets import PromptTarget
from camkit.viz import overlay_on_photo
from camkit.viz.text import token_html

Region = tuple[float, float, float, float]  # where the model's input lies on the photo


def slug(text: str) -> str:
    """A file-name part of a prompt or token: letters, digits, '-' (at most 40)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "token"


def check_prompts(args: argparse.Namespace) -> None:
    """``--prompt`` only for ``hf:`` models, and at least one for them."""
    if args.prompt and not args.model.startswith(HF_PREFIX):
        raise UsageError(
            f"--prompt needs a vision-language model with a text tower or a language model: "
            f"--model hf:FOLDER (a local HuggingFace folder), not {args.model}"
        )
    if args.model.startswith(HF_PREFIX) and not args.prompt:
        raise UsageError(f"--model {args.model}: give the text to explain with --prompt")
    if args.model.startswith(HF_PREFIX) and args.target != "top1":
        raise UsageError(
            f"--target {args.target}: a vision-language model's targets are its prompts "
            "(--prompt) or the tokens it generates, not classes"
        )


def load_hf(model: str) -> LoadedVLM:
    """``--model hf:FOLDER`` (:func:`camkit.models.vlm.load_vlm`), its errors as usage errors:
    ``camkit explain`` and ``camkit serve`` load ``hf:`` models through this one function."""
    try:
        return load_vlm(model.removeprefix(HF_PREFIX))
    except (CamkitError, OSError) as error:
        raise UsageError(f"--model {model}: {error}") from None


def run_vlm(args: argparse.Namespace) -> int:
    """Explain each image for the prompts (:func:`check_prompts` passed): the overlays, the
    manifest (each record's ``label`` the prompt or generated token) and the report page."""
    paths, methods, out, device, _ = check_run_inputs(
        args, lambda paths, methods: check_colormap(args.colormap)
    )
    loaded = load_hf(args.model)
    loaded.model.to(device)
    if loaded.generative and len(args.prompt) != 1:
        raise UsageError("--prompt: a generative model answers one prompt; give it once")
    built = registry.Settings(batch_size=args.batch_size, composite=args.composite)
    explainers = [_explainer(loaded, name, args.layer, built) for name in methods]
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    for path in paths:
        try:
            photo = io.read_image(path, max_pixels=args.max_pixels)
        except io.READ_ERRORS as error:
            print(f"camkit: {path}: {io.read_failure(error)}", file=sys.stderr)
            records.append({"image": str(path), "error": io.read_failure(error)})
            continue
        x = loaded.preprocess(photo).unsqueeze(0).to(device)
        region = loaded.preprocess.photo_region(*photo.shape[:2])
        for name, explainer in zip(methods, explainers, strict=True):
            shot = Shot(path, photo, x, region, name, args)
            try:
                records += (_answer if loaded.generative else _prompts)(loaded, explainer, shot)
            except CamkitError as error:
                raise UsageError(f"{name}: {error}") from None
    settings = {"methods": methods, "prompts": list(args.prompt), "layer": args.layer}
    settings |= {"max_new_tokens": args.max_new_tokens, "colormap": args.colormap}
    head = header(settings, args.model, str(device), list(getattr(args, "argv", None) or []))
    write_manifest(out, head | {"records": records})
    if wants_report(args):
        report.write_report(out, records, colormap=args.colormap)
    written = sum("output" in record for record in records)
    failed = [record["image"] for record in records if "error" in record]
    print(f"wrote {written} overlay(s) for {len(paths) - len(failed)} image(s) to {out}")
    return exit_status(failed)


def _explainer(
    loaded: LoadedVLM, name: str, layer: str | None, settings: registry.Settings
) -> Explainer:
    try:
        explainer = registry.build(name, loaded.explained, layer, settings)
    except CamkitError as error:
        raise UsageError(f"--method {name}: {error}") from None
    if loaded.generative and not (isinstance(explainer, BaseCAM) and explainer.shares_one_pass()):
        raise UsageError(
            f"--method {name}: a generative model's tokens are explained by a gradient CAM that "
            "weighs its layer from one pass (gradcam, hirescam, layercam, xgradcam...)"
        )
    return explainer


@dataclass(frozen=True)
class Shot:
    """One photo explained by one method: what its output files are made of."""

    path: Path
    photo: np.ndarray
    x: Tensor  # the model's input (1, 3, H, W)
    region: Region
    method: str
    args: argparse.Namespace

    def save(self, k: int, label: str, heat: Tensor) -> dict:
        """The overlay ``<stem>_<method>_<k>_<label>`` of ``heat`` -> its manifest record."""
        args = self.args
        name = f"{self.path.stem}_{self.method}_{k}_{slug(label)}.{args.format}"
        picture = overlay_on_photo(self.photo, heat.cpu(), self.region, args.alpha, args.colormap)
        io.save_image(Path(args.out) / name, picture)
        record = {"image": str(self.path), "output": name, "method": self.method}
        return record | {"target": k, "label": label, "model": args.model}


def _prompts(loaded: LoadedVLM, explainer: Explainer, shot: Shot) -> list[dict]:
    """One overlay per prompt -> their records."""
    prompts = list(shot.args.prompt)
    target = PromptTarget(loaded.model, prompts, tokenizer=loaded.tokenizer)
    heat, _ = displayed(explainer, shot.x, target)
    return [shot.save(k, prompt, heat[0, k]) for k, prompt in enumerate(prompts)]


def _answer(loaded: LoadedVLM, explainer: BaseCAM, shot: Shot) -> list[dict]:
    """The answer's overlays, one per generated token, and the token page -> records."""
    try:
        answer = explain_answer(
            loaded, explainer, shot.x, shot.args.prompt[0], shot.args.max_new_tokens
        )
    except InputError as error:
        raise UsageError(str(error)) from None
    records = [
        shot.save(k, answer.tokens[position], answer.explanation.maps[0, k])
        for k, position in enumerate(answer.positions)
    ]
    title = f"{shot.path.name}: {shot.method}"
    relevance = answer.explanation.token_relevance[0].cpu()
    page = token_html(answer.tokens, answer.positions, relevance, title)
    name = f"{shot.path.stem}_{shot.method}_tokens.html"
    io.write_atomic(Path(shot.args.out) / name, page.encode())
    return [record | {"tokens": name} for record in records]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--prompt`` and ``--max-new-tokens`` of ``camkit explain``."""
    parser.add_argument(
        "--prompt",
        action="append",
        metavar="TEXT",
        help="with --model hf:FOLDER: a text to explain (repeat for several): a dual encoder "
        "(CLIP, SigLIP) gets an overlay per prompt; a generative model answers it and gets an "
        "overlay per generated token and an HTML page of the prompt tokens' relevance",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=8,
        metavar="N",
        help="tokens a generative model generates (default %(default)s)",
    )
