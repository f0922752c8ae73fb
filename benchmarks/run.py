"""camkit against pytorch-grad-cam, torchcam, captum and the floor, timed in one run.

    python benchmarks/run.py [--device cpu|cuda|all] [--repeats 5] [--quick]
                             [--cases gradcam,multiclass,cams,scorecam,smoothgrad,
                                     sscam,iscam,reciprocam]
                             [--threads N] [--out benchmarks/RESULTS.md]
    python benchmarks/run.py --agreement   # top_k agreement of Score-/Ablation-CAM (not timed)

Each case builds every implementation of the same computation (same model, layer, targets and
finishing), runs each once (warm-up; its peak memory and its map's Pearson correlation with
camkit's are taken there), then times ``--repeats`` rounds, each running every implementation
once in a rotating order (interleaved, so a busy machine slows all alike), and reports medians.
Peers are imported lazily and skipped with a note when missing. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import io
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

CASES = (
    "gradcam",
    "multiclass",
    "cams",
    "scorecam",
    "smoothgrad",
    "sscam",
    "iscam",
    "reciprocam",
)
GRADIENT_METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam", "hirescam")


@dataclass
class Impl:
    """One implementation: ``run()`` returns its maps (for the correlation) or None."""

    name: str
    run: Callable[[], object]


@dataclass
class Rule:
    """Target: the case's subject takes at most ``factor`` x this implementation's time."""

    against: str
    factor: float
    less_memory: bool = False

    def text(self) -> str:
        memory = ", less memory" if self.less_memory else ""
        return f"camkit <= {self.factor:g}x this{memory}"


@dataclass
class Case:
    key: str
    title: str
    subject: str
    model: nn.Module | None
    impls: list[Impl]
    rules: list[Rule]
    notes: list[str] = field(default_factory=list)


@dataclass
class Row:
    case: Case
    impl: str
    times: list[float]
    peak_mb: float
    corr: float | None

    @property
    def median(self) -> float:
        return statistics.median(self.times)


# --------------------------------------------------------------------------- helpers


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def resnet(arch: str, device: torch.device) -> nn.Module:
    from torchvision import models

    torch.manual_seed(0)
    return getattr(models, arch)(weights=None).eval().to(device)


def images(batch: int, device: torch.device) -> Tensor:
    return torch.randn(batch, 3, 224, 224, generator=seeded(1)).to(device)


def classes(shape: tuple[int, ...], device: torch.device) -> Tensor:
    return torch.randint(1000, shape, generator=seeded(2)).to(device)


def finish(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """What camkit's finishing does, for peers that stop earlier: ReLU, upsample, min-max."""
    maps = F.interpolate(maps.relu(), size=size, mode="bilinear", align_corners=False)
    low = maps.amin(dim=(-2, -1), keepdim=True)
    high = maps.amax(dim=(-2, -1), keepdim=True)
    return (maps - low) / (high - low).clamp_min(1e-12)


def correlation(ours: object, theirs: object) -> float | None:
    """Mean Pearson correlation over maps (leading dims index maps, the last two are pixels);
    maps that are constant in either result (no correlation defined) are left out."""
    if ours is None or theirs is None:
        return None
    a, b = (torch.as_tensor(m).detach().float().cpu() for m in (ours, theirs))
    a, b = a.reshape(-1, a.shape[-2] * a.shape[-1]), b.reshape(-1, b.shape[-2] * b.shape[-1])
    values = torch.stack(
        [torch.corrcoef(torch.stack([u, v]))[0, 1] for u, v in zip(a, b, strict=True)]
    )
    return float(values.nanmean())


def quiet(fn: Callable[[], object]) -> Callable[[], object]:
    """Silence a peer's progress bars (stderr), which would otherwise flood the output."""

    def run() -> object:
        with contextlib.redirect_stderr(io.StringIO()):
            return fn()

    return run


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """Run ``fn`` once; return (peak MB allocated above what existed before, its result).

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: torch's allocations replayed from the
    profiler's memory events (op granularity), so NumPy/OpenCV buffers are not counted.
    """
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20, result
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak / 2**20, result


def fresh(case: Case) -> None:
    """Drop parameter gradients a peer's ``loss.backward()`` left, and collect garbage."""
    case.model.zero_grad(set_to_none=True)
    gc.collect()


def timed(fn: Callable[[], object], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


# --------------------------------------------------------------------------- peers


def pgc_cam(method: str, model: nn.Module, layer: nn.Module, x: Tensor, targets: Tensor, **attrs):
    """pytorch-grad-cam, hooks released after the call (else they slow every later forward)."""
    import pytorch_grad_cam
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    with getattr(pytorch_grad_cam, method)(model, [layer]) as cam:
        for key, value in attrs.items():
            setattr(cam, key, value)
        return cam(x, [ClassifierOutputTarget(int(t)) for t in targets])


def torchcam_cam(method: str, model: nn.Module, layer: str, x: Tensor, targets: Tensor, **kw):
    from torchcam import methods

    with getattr(methods, method)(model, layer, input_shape=tuple(x.shape[1:]), **kw) as cam:
        grad = method not in ("ScoreCAM", "SSCAM", "ISCAM")
        with torch.set_grad_enabled(grad):
            scores = model(x)
        maps = cam(class_idx=targets.tolist(), scores=scores)[0]
    return finish(maps.unsqueeze(1), tuple(x.shape[-2:])).squeeze(1)


FLOOR = "floor: torch.inference_mode() forward"


def inference_forward(model: torch.nn.Module, x: Tensor) -> Callable[[], None]:
    """The floor of any explanation: one plain forward in ``torch.inference_mode()``, with the
    input in the memory format camkit hands the model (channels_last on the CPU)."""
    if x.device.type == "cpu":
        x = x.contiguous(memory_format=torch.channels_last)

    def forward() -> None:
        with torch.inference_mode():
            model(x)

    return forward


def peer(name: str, build: Callable[[], Callable[[], object]], notes: list[str]) -> list[Impl]:
    """``[Impl]`` when the peer imports, else ``[]`` and a note."""
    try:
        return [Impl(name, build())]
    except ImportError as err:
        notes.append(f"{name} skipped: {err}")
        return []


# --------------------------------------------------------------------------- cases


def case_gradcam(device: torch.device) -> Case:
    import camkit

    model, x = resnet("resnet50", device), images(8, device)
    targets = classes((8,), device)
    notes: list[str] = []

    def hand_written_hooks() -> None:
        store: list[Tensor] = []
        handle = model.layer4.register_forward_hook(lambda m, i, out: store.append(out))
        try:
            scores = model(x).gather(1, targets[:, None]).sum()
        finally:
            handle.remove()
        torch.autograd.grad(scores, store[0])

    def captum_build() -> Callable[[], object]:
        from captum.attr import LayerGradCam

        explainer = LayerGradCam(model, model.layer4)
        size = tuple(x.shape[-2:])
        return lambda: finish(explainer.attribute(x, target=targets), size).squeeze(1)

    impls = [
        Impl("camkit GradCAM", lambda: camkit.GradCAM(model, "layer4")(x, targets)),
        Impl(FLOOR, inference_forward(model, x)),
        Impl("hand-written hooks (forward + autograd.grad to layer4)", hand_written_hooks),
    ]
    impls += peer(
        "pytorch-grad-cam GradCAM",
        lambda: lambda: pgc_cam("GradCAM", model, model.layer4, x, targets),
        notes,
    )
    impls += peer(
        "torchcam GradCAM",
        lambda: lambda: torchcam_cam("GradCAM", model, "layer4", x, targets),
        notes,
    )
    impls += peer("captum LayerGradCam", captum_build, notes)
    rules = [
        Rule(FLOOR, 1.15),
        Rule("pytorch-grad-cam GradCAM", 0.5),
        Rule("torchcam GradCAM", 1.0),
        Rule("captum LayerGradCam", 1.0),
    ]
    title = "Grad-CAM, ResNet-50 layer4, batch 8"
    return Case("gradcam", title, "camkit GradCAM", model, impls, rules, notes)


def case_multiclass(device: torch.device) -> Case:
    import camkit

    model, x = resnet("resnet50", device), images(8, device)
    targets = classes((8, 10), device)
    cam = camkit.GradCAM(model, "layer4")
    impls = [
        Impl("camkit GradCAM, 10 targets in one call", lambda: cam(x, targets)),
        Impl(
            "10 separate camkit calls",
            lambda: torch.stack([cam(x, targets[:, k]) for k in range(10)], dim=1),
        ),
        Impl(FLOOR, inference_forward(model, x)),
    ]
    title = "Grad-CAM for 10 classes per image, ResNet-50, batch 8"
    subject = "camkit GradCAM, 10 targets in one call"
    rules = [Rule("10 separate camkit calls", 0.35), Rule(FLOOR, 1.3)]
    return Case("multiclass", title, subject, model, impls, rules)


def case_cams(device: torch.device) -> Case:
    import camkit

    model, x = resnet("resnet50", device), images(8, device)
    targets = classes((8,), device)
    impls = [
        Impl(
            "camkit cams(), 5 methods",
            lambda: camkit.cams(model, "layer4", x, targets, methods=GRADIENT_METHODS)["gradcam"],
        ),
        Impl("one camkit GradCAM", lambda: camkit.GradCAM(model, "layer4")(x, targets)),
        Impl(FLOOR, inference_forward(model, x)),
    ]
    title = "5 gradient CAM methods from one cams() call, ResNet-50, batch 8"
    notes = [f"methods: {', '.join(GRADIENT_METHODS)}; correlation compares the Grad-CAM entry"]
    rules = [Rule("one camkit GradCAM", 1.3), Rule(FLOOR, 1.4)]
    return Case("cams", title, "camkit cams(), 5 methods", model, impls, rules, notes)


def case_scorecam(device: torch.device) -> Case:
    import camkit

    model, x = resnet("resnet18", device), images(1, device)
    targets = classes((1,), device)
    notes = ["all three forward the masked images in batches of 32"]
    impls = [
        Impl("camkit ScoreCAM", lambda: camkit.ScoreCAM(model, "layer4", batch_size=32)(x, targets))
    ]
    impls += peer(
        "pytorch-grad-cam ScoreCAM",
        lambda: quiet(lambda: pgc_cam("ScoreCAM", model, model.layer4, x, targets, batch_size=32)),
        notes,
    )
    impls += peer(
        "torchcam ScoreCAM",
        lambda: lambda: torchcam_cam("ScoreCAM", model, "layer4", x, targets, batch_size=32),
        notes,
    )
    rules = [
        Rule("pytorch-grad-cam ScoreCAM", 1.0, less_memory=True),
        Rule("torchcam ScoreCAM", 1.0, less_memory=True),
    ]
    title = "Score-CAM, ResNet-18 layer4, 1 image"
    return Case("scorecam", title, "camkit ScoreCAM", model, impls, rules, notes)


def case_smoothgrad(device: torch.device) -> Case:
    import camkit

    title = "SmoothGrad, 25 samples, ResNet-18, batch 4"
    notes: list[str] = []
    model, x = resnet("resnet18", device), images(4, device)
    targets = classes((4,), device)
    smooth = camkit.SmoothGrad(model, noise_level=0.15, samples=25, batch_size=16, seed=0)
    impls = [Impl("camkit SmoothGrad", lambda: smooth(x, targets))]

    def captum_build() -> Callable[[], object]:
        from captum.attr import NoiseTunnel, Saliency

        tunnel = NoiseTunnel(Saliency(model))
        # captum takes one absolute sigma: camkit's per-sample noise_level * range, averaged
        sigma = float((0.15 * (x.flatten(1).amax(1) - x.flatten(1).amin(1))).mean())
        return lambda: tunnel.attribute(
            x,
            nt_type="smoothgrad",
            nt_samples=25,
            nt_samples_batch_size=4,  # noisy copies per sample per pass: 4 x 4 = 16 rows
            stdevs=sigma,
            target=targets,
            abs=False,
        )

    impls += peer("captum NoiseTunnel(Saliency)", captum_build, notes)
    notes.append(
        "both: mean input gradient over 25 noisy copies per image, sigma = 0.15 x value range, "
        "16 rows per forward/backward pass (camkit batch_size=16, captum "
        "nt_samples_batch_size=4 copies of each of the 4 images); the noise differs, so the "
        "correlation is that of two noise draws"
    )
    rules = [Rule("captum NoiseTunnel(Saliency)", 1.0)]
    return Case("smoothgrad", title, "camkit SmoothGrad", model, impls, rules, notes)


def case_score_variant(device: torch.device, method: str) -> Case:
    """SS-CAM or IS-CAM, camkit against torchcam 0.5 (the formulas camkit follows)."""
    import camkit

    model, x = resnet("resnet18", device), images(1, device)
    x = F.interpolate(x, size=(112, 112), mode="bilinear", align_corners=False)
    targets = classes((1,), device)
    samples = 4
    notes = [
        f"112x112 image (layer4 4x4), {samples} samples per channel, masked images in batches of 32"
    ]
    if method == "SSCAM":
        ours = camkit.SSCAM(model, "layer4", samples=samples, seed=0, batch_size=32)
        notes.append(
            "std 2.0 (torchcam's default); camkit seed=0 and torch.manual_seed(0) before "
            "torchcam draw the same noise on the CPU"
        )

        def theirs() -> object:
            torch.manual_seed(0)
            return torchcam_cam(
                "SSCAM", model, "layer4", x, targets, batch_size=32, num_samples=samples
            )
    else:
        ours = camkit.ISCAM(model, "layer4", samples=samples, batch_size=32)

        def theirs() -> object:
            return torchcam_cam(
                "ISCAM", model, "layer4", x, targets, batch_size=32, num_samples=samples
            )

    subject = f"camkit {method}"
    impls = [Impl(subject, lambda: ours(x, targets))]
    impls += peer(f"torchcam {method}", lambda: theirs, notes)
    rules = [Rule(f"torchcam {method}", 1.0, less_memory=True)]
    label = {"SSCAM": "SS-CAM", "ISCAM": "IS-CAM"}[method]
    title = f"{label}, ResNet-18 layer4, 1 image 112x112"
    return Case(method.lower(), title, subject, model, impls, rules, notes)


def case_reciprocam(device: torch.device) -> Case:
    import camkit

    model, x = resnet("resnet18", device), images(1, device)
    targets = classes((1,), device)
    notes = [
        "Recipro-CAM: 49 suffix forwards (layer4 is 7x7); the Score-CAMs forward the masked "
        "images in batches of 32; the maps are different methods' (correlation for reference)"
    ]
    recipro = camkit.ReciproCAM(model, "layer4", batch_size=32)
    impls = [
        Impl("camkit ReciproCAM", lambda: recipro(x, targets)),
        Impl(
            "camkit ScoreCAM",
            lambda: camkit.ScoreCAM(model, "layer4", batch_size=32)(x, targets),
        ),
    ]
    impls += peer(
        "pytorch-grad-cam ScoreCAM",
        lambda: quiet(lambda: pgc_cam("ScoreCAM", model, model.layer4, x, targets, batch_size=32)),
        notes,
    )
    rules = [Rule("camkit ScoreCAM", 0.25), Rule("pytorch-grad-cam ScoreCAM", 0.1)]
    title = "Recipro-CAM vs Score-CAM, ResNet-18 layer4, 1 image"
    return Case("reciprocam", title, "camkit ReciproCAM", model, impls, rules, notes)


BUILDERS: dict[str, Callable[[torch.device], Case]] = {
    "gradcam": case_gradcam,
    "multiclass": case_multiclass,
    "cams": case_cams,
    "scorecam": case_scorecam,
    "smoothgrad": case_smoothgrad,
    "sscam": lambda device: case_score_variant(device, "SSCAM"),
    "iscam": lambda device: case_score_variant(device, "ISCAM"),
    "reciprocam": case_reciprocam,
}


# --------------------------------------------------------------------------- running


def run_case(case: Case, device: torch.device, repeats: int) -> list[Row]:
    rows, reference = {}, None
    for impl in case.impls:  # warm-up: memory and maps
        fresh(case)
        peak, maps = peak_memory_mb(impl.run, device)
        reference = maps if impl.name == case.subject else reference
        rows[impl.name] = Row(case, impl.name, [], peak, None)
        rows[impl.name].corr = maps  # replaced by the correlation below
    for row in rows.values():
        row.corr = correlation(reference, row.corr)
    for r in range(repeats):
        order = case.impls[r % len(case.impls) :] + case.impls[: r % len(case.impls)]
        for impl in order:
            fresh(case)
            rows[impl.name].times.append(timed(impl.run, device))
        print(f"  {case.key}: round {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    return list(rows.values())


def verdicts(case: Case, rows: list[Row]) -> dict[str, tuple[str, str]]:
    """``{impl: (target text, "yes"/"no")}`` for the implementations a rule compares with."""
    by_name = {row.impl: row for row in rows}
    subject = by_name.get(case.subject)
    out = {}
    for rule in case.rules:
        other = by_name.get(rule.against)
        if subject is None or other is None:
            continue
        met = subject.median <= rule.factor * other.median
        if rule.less_memory:
            met = met and subject.peak_mb < other.peak_mb
        out[rule.against] = (rule.text(), "yes" if met else "**no**")
    return out


def table(rows: list[Row], device: torch.device) -> str:
    lines = [
        "| case | implementation | median s | min-max s | camkit ÷ this | peak MB | corr. with "
        "camkit | target | met |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | --- |",
    ]
    cases = list(dict.fromkeys(row.case.key for row in rows))
    for key in cases:
        case_rows = [row for row in rows if row.case.key == key]
        case = case_rows[0].case
        subject = next(row for row in case_rows if row.impl == case.subject)
        marks = verdicts(case, case_rows)
        for row in case_rows:
            target, met = marks.get(row.impl, ("", ""))
            corr = "" if row.corr is None else f"{row.corr:.4f}"
            lines.append(
                f"| {case.title} ({device.type}) | {row.impl} | {row.median:.3f} | "
                f"{min(row.times):.3f}-{max(row.times):.3f} | "
                f"{subject.median / row.median:.2f} | {row.peak_mb:.1f} | {corr} | "
                f"{target} | {met} |"
            )
    return "\n".join(lines)


END_TO_END = "<!-- end to end: written by benchmarks/pipeline.py -->"
README_START = "<!-- benchmark table: written by benchmarks/run.py from RESULTS.md -->"
README_END = "<!-- end of benchmark table -->"


def readme_table(rows: list[Row], device: torch.device) -> str:
    """The short table the README shows: camkit's time and memory and its ratio to each
    implementation a target compares it with."""
    lines = [
        README_START,
        "| case | camkit | compared with | camkit ÷ other | target | met |",
        "| --- | ---: | --- | ---: | --- | --- |",
    ]
    for key in dict.fromkeys(row.case.key for row in rows):
        case_rows = [row for row in rows if row.case.key == key]
        case = case_rows[0].case
        by_name = {row.impl: row for row in case_rows}
        subject = by_name[case.subject]
        first = True
        for other, (target, met) in verdicts(case, case_rows).items():
            cell = f"{subject.median:.2f} s, {subject.peak_mb:.0f} MB" if first else ""
            title = f"{case.title} ({device.type})" if first else ""
            lines.append(
                f"| {title} | {cell} | {other} | {subject.median / by_name[other].median:.2f} | "
                f"{target} | {met} |"
            )
            first = False
    return "\n".join([*lines, README_END])


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the README markers replaced by ``block``."""
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    return text[:start] + block + text[end:]


def summary(rows: list[Row]) -> str:
    """``Targets met: n of m`` and the missed ones."""
    cases = {row.case.key: row.case for row in rows}
    marks = {
        (case.title, impl): met
        for case in cases.values()
        for impl, (_, met) in verdicts(case, [r for r in rows if r.case is case]).items()
    }
    missed = [f"{title} vs {impl}" for (title, impl), met in marks.items() if met != "yes"]
    met = len(marks) - len(missed)
    return f"Targets met: {met} of {len(marks)}" + (
        f"; missed: {'; '.join(missed)}." if missed else "."
    )


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def versions() -> str:
    from importlib import metadata

    found = [f"torch {torch.__version__}"]
    for package in ("torchvision", "grad-cam", "torchcam", "captum"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} missing")
    return ", ".join(found)


def header(devices: list[torch.device], args: argparse.Namespace) -> str:
    names = [cpu_name()] + [torch.cuda.get_device_name(d) for d in devices if d.type == "cuda"]
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return "\n".join(
        [
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"- machine: {', '.join(names)}; {os.cpu_count()} logical CPUs; {platform.platform()}",
            f"- versions: {versions()}, Python {platform.python_version()}",
            f"- torch.set_num_threads({torch.get_num_threads()}); repeats: {args.repeats} "
            "(median, after one warm-up run per implementation); interleaved rounds",
            f"- load average (1/5/15 min) at the start: {load}",
        ]
    )


def benchmark(args: argparse.Namespace) -> None:
    wanted = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [torch.device(d) for d in wanted if d == "cpu" or torch.cuda.is_available()]
    if not devices:
        sys.exit("CUDA was asked for but torch.cuda.is_available() is False")
    skipped = [d for d in wanted if d == "cuda" and torch.device(d) not in devices]
    lines = ["# camkit benchmark results", "", header(devices, args), ""]
    if skipped:
        lines += ["CUDA not available on this machine: CPU only.", ""]
    notes = []
    readme_rows: list[Row] = []
    for device in devices:
        rows: list[Row] = []
        for key in args.cases:
            print(f"{key} on {device}...", file=sys.stderr, flush=True)
            case = BUILDERS[key](device)
            notes += [f"{case.title}: {note}" for note in case.notes]
            if case.impls:
                rows += run_case(case, device, args.repeats)
        if rows:
            lines += [f"## {device.type}", "", table(rows, device), "", summary(rows), ""]
            if device.type == "cpu":
                readme_rows = rows
    end_load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    lines += [f"Load average at the end: {end_load}.", ""]
    lines += ["Notes:", ""] + [f"- {note}" for note in dict.fromkeys(notes)]
    if readme_rows:
        lines += ["", "## For the README", "", readme_table(readme_rows, torch.device("cpu"))]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        results = Path(args.out)
        kept = results.read_text() if results.exists() else ""
        if END_TO_END in kept:  # benchmarks/pipeline.py's section stays
            text += "\n" + kept[kept.index(END_TO_END) :]
        results.write_text(text)
    if args.out and readme_rows and set(args.cases) == set(CASES):
        readme = Path(__file__).resolve().parent.parent / "README.md"
        block = readme_table(readme_rows, torch.device("cpu"))
        readme.write_text(replace_block(readme.read_text(), block))


# --------------------------------------------------------------------------- top-k agreement


def agreement(ks: tuple[int, ...] = (64, 256)) -> None:
    """Pearson correlation of top_channels Score-/Ablation-CAM maps with the exact ones on the
    default pretrained model (EfficientNet-Lite0, layer bn2, 1280 channels) over scikit-image
    photos."""
    from skimage import data

    import camkit
    from camkit.models import load

    loaded = load()
    names = ("astronaut", "camera", "chelsea", "coffee", "rocket")
    photos = [getattr(data, name)() for name in names]
    x = torch.stack([loaded.preprocess(photo) for photo in photos])
    lines = [
        "| method | top_channels of 1280 | mean Pearson r | min r | time ÷ exact |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for method in (camkit.AblationCAM, camkit.ScoreCAM):
        start = time.perf_counter()
        exact = method(loaded.model, loaded.default_layer, batch_size=64)(x)
        exact_s = time.perf_counter() - start
        for k in ks:
            start = time.perf_counter()
            approx = method(loaded.model, loaded.default_layer, batch_size=64, top_channels=k)(x)
            seconds = time.perf_counter() - start
            r = torch.stack(
                [
                    torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]
                    for a, b in zip(exact, approx, strict=True)
                ]
            )
            lines.append(
                f"| {method.__name__} | {k} | {float(r.mean()):.3f} | {float(r.min()):.3f} | "
                f"{seconds / exact_s:.2f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of --repeats")
    parser.add_argument("--cases", default=",".join(CASES), help=f"from {','.join(CASES)}")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="benchmarks/RESULTS.md")
    parser.add_argument("--agreement", action="store_true", help="measure top_channels agreement")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.agreement:
        agreement()
        return
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {CASES}")
    if args.quick:
        args.repeats = 3
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    benchmark(args)


if __name__ == "__main__":
    main()
