"""The engine every family shares.

* :mod:`~camkit.core.layers`: finding layers, hooks, always unhooking; :mod:`~camkit.core.record`
  keeps activations and gradients of the user's own passes; :mod:`~camkit.core.trace` lists a
  model's layer calls and picks the default layer (:mod:`~camkit.core.examples`: what it runs);
* :mod:`~camkit.core.inputs`: checking images, sizes and counts; :mod:`~camkit.core.wrappers`:
  the model wrappers (``InputLayout``, ``KeywordInput``); :mod:`~camkit.core.seeds`: seeds;
  :mod:`~camkit.core.formats`: the input memory format and ``autocast``;
* the target resolver lives below core, in :mod:`camkit.targets` (core imports it);
* :mod:`~camkit.core.call`: one call passed down explicitly (``Call``: the batch and the model's
  other inputs; every forward is ``call.forward``), and the one chunking policy (``chunks``);
* :mod:`~camkit.core.engine`: the tapped forward and the ``K`` targets' vector-Jacobian products;
* :mod:`~camkit.core.finish`: ReLU, upsampling, normalisation, fusing, dropping axes;
* :mod:`~camkit.core.progress`: tqdm progress bars;
* :mod:`~camkit.core.state`: buffers restored after a call on a train-mode model, and
  ``model_guarded``, the per-call guards every entry point enters;
* :mod:`~camkit.core.guards`: the guard against PyTorch's batch-norm backward bug.
"""
