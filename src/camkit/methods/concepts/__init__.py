"""Concepts: what the model sees where it looks. Numbers in, numbers out: the CLI, the report
and the explorer only call these functions.

* :class:`ConceptAttribution`: Concept Relevance Propagation (Achtibat et al., Nature Machine
  Intelligence 5, 2023): channel relevances, top-k concepts, conditional heatmaps, the graph;
* reference images: :class:`ReferenceCollector`, :class:`TopK`, :func:`receptive_boxes`;
* feature visualisation (Olah et al., Distill 2017): :func:`visualize` and
  :func:`feature_images` of a :class:`ChannelObjective`, :class:`NeuronObjective` or
  :class:`LogitObjective`;
* concepts as data: :class:`Channels`, :class:`Direction`, :class:`InRegion`, :class:`Concept`;
* the backward they use: :data:`GRADIENT` or :class:`LRPRules` (CRP proper), :class:`Rules`.
"""

from camkit.methods.concepts.concepts import (
    Channels,
    Concept,
    Direction,
    InRegion,
    TopConcepts,
    region_weights,
)
from camkit.methods.concepts.conditional import ConceptAttribution
from camkit.methods.concepts.featurevis import (
    ChannelObjective,
    FeatureImages,
    LogitObjective,
    NeuronObjective,
    feature_images,
    visualize,
)
from camkit.methods.concepts.reference import ReferenceCollector, TopK, receptive_boxes
from camkit.methods.concepts.rules import GRADIENT, GradientRules, LRPRules, Rules

__all__ = [
    "GRADIENT",
    "ChannelObjective",
    "Channels",
    "Concept",
    "ConceptAttribution",
    "Direction",
    "FeatureImages",
    "GradientRules",
    "InRegion",
    "LRPRules",
    "LogitObjective",
    "NeuronObjective",
    "ReferenceCollector",
    "Rules",
    "TopConcepts",
    "TopK",
    "feature_images",
    "receptive_boxes",
    "region_weights",
    "visualize",
]
