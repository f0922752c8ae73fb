"""Concepts: what the model sees where it looks.

* :class:`ConceptAttribution` -- Concept Relevance Propagation (Achtibat et al., Nature Machine
  Intelligence 5, 2023): channel relevances per sample, top-k concepts (in a region), their
  conditional heatmaps in one batched backward, concepts given a concept of a later layer, the
  attribution graph between two layers;
* reference images: :class:`ReferenceCollector` (streaming activation and relevance
  maximisation over a dataset, :class:`TopK` per channel), :func:`receptive_boxes` (the patch
  that drives a channel);
* feature visualisation: :func:`visualize` of a :class:`ChannelObjective`,
  :class:`NeuronObjective` or :class:`LogitObjective` (Olah et al., Distill 2017), with
  lucid's redirected ReLU gradient and restarts; :func:`feature_images` also says which images
  moved (:class:`FeatureImages`);
* concepts as data: :class:`Channels` (a channel or a group), :class:`Direction` (a user's
  direction), :class:`InRegion` (a concept in a region of the layer only), :class:`Concept`
  (the base of one's own);
* the backward they use (:class:`Rules`): :data:`GRADIENT` (gradient x activation, any model) or
  :class:`LRPRules` (camkit's LRP composites: CRP proper).

Numbers in, numbers out: the CLI, the report and the explorer only call these functions.
"""

from camkit.methods.concepts.concepts import Channels, Concept, Direction, InRegion, TopConcepts
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
from camkit.methods.concepts.regions import region_weights
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
