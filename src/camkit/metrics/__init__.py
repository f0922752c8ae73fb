"""Is the map right? Faithfulness (deletion/insertion, Average Drop, Increase in Confidence,
ROAD), localisation (pointing games) and the model-randomisation sanity check."""

from camkit.metrics.faithfulness import (
    average_drop,
    deletion,
    increase_in_confidence,
    insertion,
)
from camkit.metrics.localisation import energy_pointing_game, pointing_game
from camkit.metrics.road import road
from camkit.metrics.sanity import randomization_test

__all__ = [
    "average_drop",
    "deletion",
    "energy_pointing_game",
    "increase_in_confidence",
    "insertion",
    "pointing_game",
    "randomization_test",
    "road",
]
