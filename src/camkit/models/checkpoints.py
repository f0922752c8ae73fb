"""Reading checkpoints safely: weights only, never code from the file."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from camkit.errors import CheckpointError, CheckpointMismatchError, UnsafeCheckpointError
from camkit.models.labels import checkpoint_labels
from camkit.targets.outputs import describe

CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".safetensors"}
_NESTED_STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module")


def _is_safetensors(path: Path) -> bool:
    """safetensors files start with an 8-byte little-endian header length, then a JSON '{'."""
    with path.open("rb") as handle:
        head = handle.read(9)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return int.from_bytes(head[:8], "little") < path.stat().st_size


def _unwrap_state_dict(loaded: object, path: Path) -> dict[str, Tensor]:
    if isinstance(loaded, Mapping) and not all(isinstance(v, Tensor) for v in loaded.values()):
        nested = (loaded[key] for key in _NESTED_STATE_DICT_KEYS if key in loaded)
        loaded = next((value for value in nested if isinstance(value, Mapping)), loaded)
    if not isinstance(loaded, Mapping) or not loaded:
        raise CheckpointError(
            f"{path}: expected a state dict (a mapping of names to tensors, possibly under "
            f"{'/'.join(_NESTED_STATE_DICT_KEYS)}), got {describe(loaded)}"
        )
    bad = [(k, v) for k, v in loaded.items() if not (isinstance(k, str) and isinstance(v, Tensor))]
    if bad:
        key, value = bad[0]
        raise CheckpointError(
            f"{path}: expected a state dict of names -> tensors, but {len(bad)} entries are not "
            f"(e.g. {key!r}: {describe(value)})"
        )
    return dict(loaded)


def _unpickling_reason(message: str) -> str:
    """The informative line of a weights-only unpickling error (it names any refused GLOBAL)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line]
    if named:
        return named[0].removeprefix("WeightsUnpickler error:").split(". ")[0].strip()
    after = message.partition("WeightsUnpickler error:")[2].strip()
    return after.splitlines()[0].strip() if after else (lines[-1] if lines else "unknown error")


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """Read a state dict from a ``torch.save`` file or a ``.safetensors`` file, on the CPU:
    only tensors and plain containers (``torch.load(weights_only=True)``); a pickle needing
    other code raises :class:`UnsafeCheckpointError` without running it. A state dict nested
    under ``state_dict``/``model_state_dict``/``model``/``module`` is unwrapped."""
    return read_checkpoint(path)[0]


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Tensor], str | None]:
    """:func:`read_state_dict`, and the architecture the file names, if any: the string under
    ``"arch"`` of a ``torch.save``d dict (as timm's training script writes), or the ``"arch"``
    entry of a safetensors file's metadata."""
    state, arch, _ = _read(Path(path))
    return state, arch


def read_checkpoint_labels(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Tensor], str | None, list[str] | None]:
    """:func:`read_checkpoint`, and the class names the checkpoint carries, if any
    (:data:`camkit.models.labels.LABEL_KEYS` in the file, or ``id2label`` in a HuggingFace
    ``config.json`` beside it)."""
    state, arch, extras = _read(Path(path))
    labels = checkpoint_labels(extras, str(path))
    config = Path(path).with_name("config.json")
    if labels is None and config.is_file():
        try:
            loaded = json.loads(config.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            loaded = None
        if isinstance(loaded, Mapping) and "id2label" in loaded:
            labels = checkpoint_labels({"id2label": loaded["id2label"]}, str(config))
    return state, arch, labels


def _read(path: Path) -> tuple[dict[str, Tensor], str | None, Mapping[str, object]]:
    """The state dict, the named architecture and the file's other entries (or metadata)."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    if _is_safetensors(path):
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(path, framework="pt") as handle:
                metadata = handle.metadata() or {}
            state = load_file(path, device="cpu")
        except SafetensorError as error:
            raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None
        return _unwrap_state_dict(state, path), metadata.get("arch"), metadata
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = _unpickling_reason(str(error))
        if "GLOBAL" in reason:
            raise UnsafeCheckpointError(
                f"{path} is not a plain state dict: loading it would run pickled code, so it was "
                f"refused and nothing in it was run ({reason}). Save weights only: "
                "torch.save(model.state_dict(), path) or "
                "safetensors.torch.save_file(model.state_dict(), path)"
            ) from None
        raise CheckpointError(
            f"{path}: not a checkpoint torch.load(weights_only=True) can read ({reason}); "
            "nothing in it was run"
        ) from None
    except (RuntimeError, EOFError, OSError) as error:
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({error})") from None
    extras = loaded if isinstance(loaded, Mapping) else {}
    arch = extras.get("arch")
    return _unwrap_state_dict(loaded, path), arch if isinstance(arch, str) else None, extras


def _optional_key(name: str) -> bool:
    """BatchNorm counters that old checkpoints lack; PyTorch fills them in."""
    return name.endswith("num_batches_tracked")


def strip_shared_prefix(state: dict[str, Tensor], expected: Iterable[str]) -> dict[str, Tensor]:
    """Drop wrapper prefixes (``module.``, ``_orig_mod.``, ``model.``...) shared by every key,
    up to twice, where the stripped names then match the model's exactly."""
    wanted = {name for name in expected if not _optional_key(name)}
    for _ in range(2):
        present = {name for name in state if not _optional_key(name)}
        if present == wanted:
            break
        prefixes = {name.split(".", 1)[0] for name in state}
        if len(prefixes) != 1 or any("." not in name for name in state):
            break
        stripped = {name.split(".", 1)[1]: tensor for name, tensor in state.items()}
        if {name for name in stripped if not _optional_key(name)} - wanted:
            break
        state = stripped
    return state


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def check_fits(model: nn.Module, state: Mapping[str, Tensor], source: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state and not _optional_key(k)]
    unexpected = [k for k in state if k not in expected]
    wrong_shape = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    found = [
        ("missing from the file", missing, 5),
        ("not in the model", unexpected, 5),
        ("different shapes", wrong_shape, 3),
    ]
    parts = [f"{what}: {_few(names, limit)}" for what, names, limit in found if names]
    if not parts:
        return
    raise CheckpointMismatchError(
        f"{source} does not fit {type(model).__name__}: "
        + "; ".join(parts)
        + ". Is it the right architecture (and number of classes)?"
    )


def classifier_classes(model: nn.Module, state: Mapping[str, Tensor]) -> int | None:
    """Classes of the checkpoint's head (the model's last ``nn.Linear`` / ``nn.Conv2d``) when
    only its size differs from the model's, else None."""
    heads = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    key = f"{heads[-1]}.weight" if heads else None
    current, stored = model.state_dict().get(key), state.get(key)
    if current is None or stored is None or stored.ndim != current.ndim:
        return None
    resized = stored.shape[0] != current.shape[0] and stored.shape[1:] == current.shape[1:]
    return int(stored.shape[0]) if resized else None
