"""Models to explain: the default pretrained model, builders, safe checkpoints, labels, inputs;
``load("efficientnet_lite0")``, ``load("torchvision:resnet50", weights="r50.pth")``,
``load("timm:convnext_tiny", weights=...)``, all offline (nothing is downloaded)."""

from camkit.core.trace import (
    default_layer,
    layer_shapes,
    map_layer_shapes,
    map_layers,
    skipped_layers,
)
from camkit.errors import (
    CheckpointError,
    CheckpointMismatchError,
    UnknownModelError,
    UnsafeCheckpointError,
)
from camkit.models.builders import DEFAULT_MODEL
from camkit.models.checkpoints import read_checkpoint, read_checkpoint_labels, read_state_dict
from camkit.models.framewise import FrameConsensus, frame_wise
from camkit.models.labels import imagenet_labels, read_labels
from camkit.models.load import LoadedModel, RandomWeightsWarning, load, top_classes
from camkit.models.preprocess import (
    CROPS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    AssumedPreprocessWarning,
    Preprocess,
    carried_preprocess,
    preprocess,
    preprocess_of,
)

__all__ = [
    "AssumedPreprocessWarning",
    "CROPS",
    "DEFAULT_MODEL",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CheckpointError",
    "CheckpointMismatchError",
    "FrameConsensus",
    "LoadedModel",
    "Preprocess",
    "RandomWeightsWarning",
    "UnknownModelError",
    "UnsafeCheckpointError",
    "carried_preprocess",
    "default_layer",
    "frame_wise",
    "imagenet_labels",
    "layer_shapes",
    "map_layer_shapes",
    "map_layers",
    "load",
    "preprocess",
    "preprocess_of",
    "read_checkpoint",
    "read_checkpoint_labels",
    "read_labels",
    "read_state_dict",
    "skipped_layers",
    "top_classes",
]
