"""The model kinds, inputs and model checks of the conformance matrix (tests/test_conformance.py).

Every model is tiny, seeded and in eval mode (but the train-mode kind), so that every registered
method runs on every kind in milliseconds: a torchvision-style CNN, a timm ViT (prefix token +
patch tokens), a timm Swin (channels-last block outputs), a ``Conv3d`` volume network, a
two-input network that needs ``additional_forward_args``, an ``nn.DataParallel`` wrapper, a
1-channel CNN, a model that takes its image as a keyword (HuggingFace style, through
``camkit.KeywordInput``); and for issue 25: a token model whose detection tokens come after the
patches (YOLOS), a model that calls one module twice per forward, and a model left in train
mode whose forwards write buffers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import timm
import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

import camkit

CLASSES = 10


class TinyCNN(nn.Module):
    """torchvision layout (``features``, ``avgpool``, ``classifier``): two conv/BN/ReLU stages of
    stride 2, 8 channels on an 8x8 grid for a 32x32 input, global average pooling and a linear
    head."""

    def __init__(
        self,
        conv: type[nn.Module] = nn.Conv2d,
        norm: type[nn.Module] = nn.BatchNorm2d,
        channels: int = 3,
    ):
        super().__init__()
        pool = nn.AdaptiveAvgPool2d(1) if conv is nn.Conv2d else nn.AdaptiveAvgPool3d(1)
        self.features = nn.Sequential(
            conv(channels, 6, 3, stride=2, padding=1),
            norm(6),
            nn.ReLU(inplace=True),
            conv(6, 8, 3, stride=2, padding=1),
            norm(8),
            nn.ReLU(inplace=True),
        )
        self.avgpool = pool
        self.classifier = nn.Linear(8, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class TwoInputNet(nn.Module):
    """``model(image, extra)``: the CNN's logits plus a per-sample ``(B, 4)`` side input mapped
    to the classes (as a multi-modal model); refuses to run without it."""

    def __init__(self):
        super().__init__()
        self.net = TinyCNN()
        self.side = nn.Linear(4, CLASSES)

    def forward(self, x: Tensor, extra: Tensor) -> Tensor:
        return self.net(x) + self.side(extra)


class KeywordNet(nn.Module):
    """HuggingFace style: called as ``model(pixel_values=x)``, never positionally."""

    def __init__(self):
        super().__init__()
        self.net = TinyCNN()

    def forward(self, *, pixel_values: Tensor) -> Tensor:
        return self.net(pixel_values)


class TokensAfterNet(nn.Module):
    """YOLOS order: ``[class] + 16 patches + 2 detection tokens`` (the detection tokens sit
    after the patches), two timm blocks, the classifier on the class token. The layout must
    come from the model (``cls_token``, ``detection_tokens``), not from the token count."""

    def __init__(self, dim: int = 24):
        super().__init__()
        self.patch_size = 8
        self.patch_embed = nn.Conv2d(3, dim, 8, stride=8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.detection_tokens = nn.Parameter(torch.randn(1, 2, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + 16 + 2, dim) * 0.02)
        self.blocks = nn.Sequential(*(timm.models.vision_transformer.Block(dim, 2) for _ in "ab"))
        self.norm = nn.LayerNorm(dim)
        self.fc_norm = nn.Identity()  # timm's names: LeGrad's score projection finds them
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        patches = self.patch_embed(x).flatten(2).transpose(1, 2)
        batch = x.shape[0]
        tokens = torch.cat(
            [
                self.cls_token.expand(batch, -1, -1),
                patches,
                self.detection_tokens.expand(batch, -1, -1),
            ],
            dim=1,
        )
        return self.head(self.norm(self.blocks(tokens + self.pos_embed))[:, 0])


class SharedActNet(nn.Module):
    """A ``ReLU`` module called twice in one forward (as torchvision's ResNet blocks reuse
    ``relu``), then a TinyCNN-like last stage: every layered method refuses ``act`` (it runs
    twice) and the default layer is never it."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1)
        self.act = nn.ReLU()
        self.features = nn.Sequential(
            nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(8, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.conv2(self.act(self.conv1(x))))
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class RunningMean(nn.Module):
    """Identity that, in train mode, updates a running mean of its input's channels (what a
    batch norm does to its statistics) and counts its calls."""

    def __init__(self, channels: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(channels))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(x.mean(dim=(0, 2, 3)), alpha=0.1)
                self.calls.add_(1)
        return x


class TrainModeNet(TinyCNN):
    """TinyCNN without batch norms, left in ``train()``, with a zero-rate dropout and a
    :class:`RunningMean`: its output is the eval output (so every comparison holds, batch
    statistics would make the maps batch-dependent), but each forward camkit runs writes its
    buffers, which camkit must restore after every call."""

    train_mode = True

    def __init__(self):
        super().__init__(norm=nn.Identity)
        self.features.insert(3, RunningMean(6))
        self.drop = nn.Dropout(0.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.drop(torch.flatten(self.avgpool(self.features(x)), 1)))


def _timm(name: str, **config: Any) -> Callable[[], nn.Module]:
    """A timm architecture at 32x32 with random weights and 10 classes (nothing downloaded)."""
    return lambda: timm.create_model(
        name, pretrained=False, img_size=32, num_classes=CLASSES, **config
    )


_vit = _timm("vit_tiny_patch16_224", patch_size=8, depth=2, embed_dim=24, num_heads=2)
_swin = _timm(
    "swin_tiny_patch4_window7_224",
    patch_size=4,
    window_size=4,
    embed_dim=12,
    depths=(1, 1),
    num_heads=(1, 2),
)


@dataclass
class Kind:
    """One model kind of the matrix: how to build it, its input, the layer named explicitly and
    the extra forward arguments it needs."""

    name: str
    build: Callable[[], nn.Module]
    shape: tuple[int, ...]  # one sample
    layer: str  # a layer named explicitly (not the default layer)
    default: str  # the default layer, known by hand (the names of the unwrapped model)
    blocks: list[str] | None = None  # attention blocks, for the attention methods
    extra: Callable[[int], tuple] | None = None  # additional_forward_args for B samples
    _cache: dict = field(default_factory=dict, repr=False)

    def model(self) -> nn.Module:
        """A fresh copy of the kind's seeded model in eval mode (the same weights every time)."""
        if "model" not in self._cache:
            self._cache["model"] = self._seeded()
        return copy.deepcopy(self._cache["model"])

    def _seeded(self) -> nn.Module:
        torch.manual_seed(0)
        model = self.build().eval()
        for module in model.modules():  # batch norms that do something
            if isinstance(module, nn.BatchNorm2d | nn.BatchNorm3d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
        # every layer into the classes (the two-input model's image and side heads)
        heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
        heads = [m for m in heads if m.out_features == CLASSES]
        with torch.no_grad():  # positive class weights and logits: no class has a blank map
            for head in heads:
                head.weight.abs_()
                head.bias.fill_(1.0)
        return model.train() if getattr(model, "train_mode", False) else model

    def input(self, batch: int = 2) -> Tensor:
        generator = torch.Generator().manual_seed(1)
        return torch.rand((batch, *self.shape), generator=generator)

    def call_options(self, batch: int) -> dict[str, Any]:
        """The call's ``additional_forward_args`` for a batch of ``batch`` samples, if any."""
        if self.extra is None:
            return {}
        return {"additional_forward_args": self.extra(batch)}

    @property
    def spatial(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def volume(self) -> bool:
        """A volume's one sample ``(C, D, H, W)`` reads as a batch of images: always batched."""
        return len(self.shape) == 4


def _side_input(batch: int) -> tuple[Tensor]:
    return (torch.arange(batch * 4, dtype=torch.float32).reshape(batch, 4) / 8,)


KINDS = {
    kind.name: kind
    for kind in (
        Kind("cnn", TinyCNN, (3, 32, 32), "features.5", "features"),
        Kind("vit", _vit, (3, 32, 32), "blocks.0.norm1", "blocks.1.norm1", blocks=["blocks.1"]),
        Kind(
            "swin",
            _swin,
            (3, 32, 32),
            "layers.0.blocks.0.norm1",
            "layers.1.blocks.0.norm1",
            blocks=["layers.1.blocks.0"],
        ),
        Kind(
            "volume",
            lambda: TinyCNN(nn.Conv3d, nn.BatchNorm3d),
            (3, 6, 12, 12),
            "features.5",
            "features",
        ),
        Kind(
            "two-input",
            TwoInputNet,
            (3, 32, 32),
            "net.features.5",
            "net.features",
            extra=_side_input,
        ),
        Kind("gray", lambda: TinyCNN(channels=1), (1, 32, 32), "features.5", "features"),
        Kind(
            "keyword",
            lambda: camkit.KeywordInput(KeywordNet(), "pixel_values"),
            (3, 32, 32),
            "net.features.5",
            "net.features",
        ),
        Kind(
            "dataparallel",
            lambda: nn.DataParallel(TinyCNN()),
            (3, 32, 32),
            "features.5",
            "features",
        ),
        Kind(
            "tokens-after",
            TokensAfterNet,
            (3, 32, 32),
            "blocks.0.norm1",
            "blocks.1.norm1",
            blocks=["blocks.1"],
        ),
        Kind("shared-layer", SharedActNet, (3, 32, 32), "features.2", "features"),
        Kind("train-mode", TrainModeNet, (3, 32, 32), "features.6", "features"),
    )
}


# ----------------------------------------------------------------------------- model checks


def _hook_counts(module: nn.Module) -> tuple[int, ...]:
    names = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_full_backward_hooks",
        "_full_backward_pre_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
    )
    return tuple(len(getattr(module, name, None) or ()) for name in names)


def _tensor_hooks(t: Tensor) -> int:
    return len(t._backward_hooks or {}) + len(getattr(t, "_post_accumulate_grad_hooks", None) or {})


def model_state(model: nn.Module) -> dict[str, Any]:
    """Everything camkit promises to leave as it found it on the user's model."""
    modules = list(model.modules())
    return {
        "training": [m.training for m in modules],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad is None for p in model.parameters()],
        "inplace": [getattr(m, "inplace", None) for m in modules],
        "fused_attn": [getattr(m, "fused_attn", None) for m in modules],
        "modules": [(n, id(m)) for n, m in model.named_modules()],
        "module hooks": [_hook_counts(m) for m in modules],
        "tensor hooks": [_tensor_hooks(t) for t in (*model.parameters(), *model.buffers())],
        "global hooks": [
            len(torch_module._global_forward_hooks),
            len(torch_module._global_forward_pre_hooks),
            len(torch_module._global_backward_hooks),
        ],
        "instance attributes": [sorted(vars(m)) for m in modules],
        "params": [p.detach().clone() for p in model.parameters()],
        "buffers": [b.detach().clone() for b in model.buffers()],
        "grad mode": torch.is_grad_enabled(),
    }


def assert_untouched(model: nn.Module, before: dict[str, Any]) -> None:
    """The model's state equals ``before`` (from :func:`model_state`), key by key."""
    after = model_state(model)
    for key, value in before.items():
        if key in ("params", "buffers"):
            assert all(torch.equal(a, b) for a, b in zip(value, after[key], strict=True)), key
        else:
            assert after[key] == value, f"{key} changed on the model"


class Tripwire(Exception):
    """Raised from inside the model's forward by :func:`tripwire`."""


@contextmanager
def tripwire(model: nn.Module) -> Iterator[None]:
    """Make the model's last linear layer raise :class:`Tripwire` inside the forward (after
    every explained layer has run), by a flag set on the built model; undone on exit."""
    head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]

    def explode(*args: Any, **kwargs: Any) -> None:
        raise Tripwire("the model's forward raised")

    head.forward = explode
    try:
        yield
    finally:
        del head.forward
