"""Is the map right? Faithfulness (deletion/insertion, Average Drop, Increase in Confidence,
ROAD), localisation (pointing games), the model-randomisation sanity check, and the map
similarities it uses (Spearman, SSIM, HOG), to compare e.g. the maps of two checkpoints; for
clips, when: the map's mass per frame and the drop in score when a frame is removed."""

from camkit.metrics.faithfulness import (
    average_drop,
    deletion,
    increase_in_confidence,
    insertion,
)
from camkit.metrics.frames import frame_drop, frame_importance
from camkit.metrics.localisation import energy_pointing_game, pointing_game
from camkit.metrics.road import road
from camkit.metrics.sanity import hog_similarity, randomization_test, spearman, ssim

__all__ = [
    "average_drop",
    "deletion",
    "energy_pointing_game",
    "frame_drop",
    "frame_importance",
    "hog_similarity",
    "increase_in_confidence",
    "insertion",
    "pointing_game",
    "randomization_test",
    "road",
    "spearman",
    "ssim",
]
