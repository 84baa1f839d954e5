"""``model.remat``: the training forward pass in checkpointed segments (gradient checkpointing, rematerialisation).

A backward pass needs every layer's activations; kept from the forward pass they are most of a step's memory.
Here the model's graph is cut where one tensor carries everything the later layers read (after each layer of a
Sequential model, after each block of a ResNet whose skip connections have joined, inside a nested model too),
and the stretches between cuts are grouped into N segments. Each segment runs under ``tf.recompute_grad``: the
forward pass keeps only the segments' inputs, and the backward pass runs each segment again, one at a time, to
get its activations. The activations held at once drop from every layer's to about one segment's plus the N
boundaries (N about the square root of the cuts by default), for about one more forward pass of compute.

The recomputation gives the same numbers as the first pass: a segment's state (``BatchNormalization``'s moving
statistics, the seed generators of ``Dropout`` and random augmentation layers) is read as it was before the
segment ran, in both passes (Keras's ``StatelessScope``), and updated once, after the forward pass; so gradients,
dropout masks and moving statistics equal those of a run without ``model.remat``. The model itself is not
changed: the segments are functional models over the same layers, used only by tfgpu's training step, so the
saved model, evaluation, ``predict`` and exports are those of the plain model.

Keras's own ``keras.RematScope`` is not used: with Keras 3.15.1 its ``full`` and ``list_of_layers`` modes fail
in TensorFlow's compiled step (``tf.recompute_grad`` is given the layer's keyword arguments, which
``tf.custom_gradient`` refuses in a graph), ``larger_than`` fails on an EagerTensor, ``full`` and
``larger_than`` fail to build on JAX, and per-layer recomputation keeps every layer's input anyway (1,887 against
1,904 MiB peak, measured on this machine).

Wraps: https://www.tensorflow.org/api_docs/python/tf/recompute_grad
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ...errors import ConfigError


def check(cfg: Any) -> None:
    """Refuse ``model.remat`` where tfgpu's step does not run, before TensorFlow starts.

    Raises:
        ConfigError: ``model.remat`` on ``backend: jax`` (Keras's own JAX step computes the forward pass).
    """
    if cfg.model.remat is not None and cfg.backend == "jax":
        raise ConfigError(
            "model.remat checkpoints segments in tfgpu's TensorFlow training step, and this recipe trains on "
            "backend: jax, whose step is Keras's own (Keras's RematScope modes fail to build there with Keras 3.15.1).",
            "remove model.remat, or use backend: tensorflow.")


def graph_of(model: Any) -> Any:
    """The functional graph of a ``keras.Sequential`` or functional ``keras.Model``, else ``None`` (a subclassed
    model, whose call is Python code with no graph to cut)."""
    from keras.src.models.functional import Functional  # noqa: PLC0415
    from keras.src.models.sequential import Sequential  # noqa: PLC0415

    if isinstance(model, Sequential):
        return model._functional if isinstance(getattr(model, "_functional", None), Functional) else None
    return model if isinstance(model, Functional) else None


def _stretches(graph: Any) -> list[tuple[Any, Any, list]]:
    """``graph``'s nodes in order, cut where one tensor is the only one later nodes read: ``[(start, end, nodes)]``,
    ``start`` the stretch's input (the graph's own input structure for the first), ``end`` the tensor at the cut
    (the graph's outputs for the last)."""
    nodes = [node for depth in sorted(graph._nodes_by_depth, reverse=True)  # inputs first: a topological order
             for node in graph._nodes_by_depth[depth] if not node.is_input]
    uses: dict[int, int] = {}
    for node in nodes:
        for t in node.input_tensors:
            uses[id(t)] = uses.get(id(t), 0) + 1
    for t in graph.outputs:
        uses[id(t)] = uses.get(id(t), 0) + 1  # an output stays alive to the end
    live = {id(t): t for t in graph.inputs}
    stretches, start, current = [], graph.input, []
    for node in nodes:
        current.append(node)
        for t in node.input_tensors:
            uses[id(t)] -= 1
            if not uses[id(t)]:
                live.pop(id(t), None)
        live.update({id(t): t for t in node.output_tensors if uses.get(id(t))})
        if len(live) == 1 and node is not nodes[-1]:
            (end,) = live.values()
            stretches.append((start, end, current))
            start, current = end, []
    if current:
        stretches.append((start, graph.output, current))
    return stretches


def units_of(model: Any) -> list[Any]:
    """The pieces a segment is made of: a functional model over ``model``'s layers for each stretch between two
    cuts; a nested Sequential or functional model with one input and one output is cut inside too."""
    import keras  # noqa: PLC0415

    units = []
    for start, end, nodes in _stretches(graph_of(model)):
        inner = graph_of(nodes[0].operation) if len(nodes) == 1 else None
        if inner is not None and len(inner.inputs) == 1 and len(inner.outputs) == 1:
            units.extend(units_of(nodes[0].operation))
        else:
            units.append(keras.Model(start, end))
    return units


class Segments:
    """``model``'s training forward pass in ``count`` checkpointed segments (see the module's docstring).

    Args:
        model: a built ``keras.Sequential`` or functional ``keras.Model``.
        count: segments; ``None``: the square root of the stretches between cuts, rounded (at least 2).

    Attributes:
        segments: each segment's units (functional models sharing ``model``'s layers), in order.
        cuts: the places the model can be cut (one fewer than the stretches between them).
        checkpoints: the layers whose outputs the forward pass keeps (each segment's last layer but the model's).

    Raises:
        ConfigError: a subclassed model, a model with no point to cut, ``count`` above the cuts, or a layer with an
            activity regulariser (its loss is added during the call, which a recomputed segment cannot repeat).
    """

    def __init__(self, model: Any, count: Optional[int]) -> None:
        if graph_of(model) is None:
            raise ConfigError(
                f"model.remat needs a keras.Sequential or functional model, and the builder's model is a subclass "
                f"({type(model).__name__}) whose call is Python code with no graph to cut.",
                "build the model with keras.Sequential or the functional API, or call keras.remat on blocks in your "
                "own call and remove model.remat.")
        regularised = [layer.name for layer in model._flatten_layers()
                       if getattr(layer, "activity_regularizer", None) is not None]
        if regularised:
            raise ConfigError(
                f"model.remat: layer {regularised[0]!r} has an activity_regularizer, whose loss is added while the "
                "layer runs and would be lost in a recomputed segment.",
                "remove the activity_regularizer (a kernel_regularizer works with model.remat), or remove model.remat.")
        units = units_of(model)
        if len(units) < 2:
            raise ConfigError(
                "model.remat: the model has no point where one tensor carries everything after it, so it cannot be "
                "cut into segments.",
                "remove model.remat (checkpointing the whole model as one segment saves nothing).")
        default = max(2, round(math.sqrt(len(units))))
        count = count or default
        if count > len(units):
            raise ConfigError(
                f"model.remat.segments: {count}, and the model can be cut into at most {len(units)} segments.",
                f"set model.remat.segments between 2 and {len(units)}, or model.remat: true (about {default}).")
        bounds = [round(i * len(units) / count) for i in range(count + 1)]
        self.segments = [units[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        self.cuts = len(units) - 1
        self.checkpoints = [segment[-1].layers[-1].name for segment in self.segments[:-1]]

    def describe(self) -> dict[str, Any]:
        """What ``summary.json`` records: ``{"segments": N, "cuts": C, "checkpoints": [layer names]}``."""
        return {"segments": len(self.segments), "cuts": self.cuts, "checkpoints": list(self.checkpoints)}

    def __call__(self, x: Any) -> Any:
        """The model's output for ``x`` with ``training=True``, each segment under ``tf.recompute_grad`` (call in a
        ``tf.GradientTape`` in a replica's step)."""
        for segment in self.segments:
            x = _checkpointed(segment, x)
        return x


def _checkpointed(units: list, x: Any) -> Any:
    """One segment's output; its state read as before the segment ran, in both passes, and updated once."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    seen: dict[int, Any] = {}
    for unit in units:
        seen.update({id(v): v for v in unit.non_trainable_variables})
    states = list(seen.values())
    before = [tf.identity(v.value) for v in states]  # read before the forward pass writes them
    updated: list = []

    structure = x  # the first segment takes the model's inputs as the model does (a tensor, a list, a mapping)

    @tf.recompute_grad
    def run(*flat: Any) -> Any:
        with keras.StatelessScope(state_mapping=list(zip(states, before)), collect_losses=True) as scope:
            first = dict(scope.state_mapping)
            y = tf.nest.pack_sequence_as(structure, list(flat))
            for unit in units:
                y = unit(y, training=True)
        if scope.losses:
            raise ConfigError(
                f"model.remat: a layer in {units[0].layers[0].name}..{units[-1].layers[-1].name} adds a loss while "
                "it runs (add_loss), which a recomputed segment cannot repeat.",
                "add the loss outside the layer's call (a kernel_regularizer, or the compiled loss), or remove "
                "model.remat.")
        changed = [v for v in states if scope.state_mapping[id(v)] is not first[id(v)]]
        updated[:] = changed  # the same in the recomputation: the segment is traced the same way
        return (y, *[scope.state_mapping[id(v)] for v in changed])

    y, *values = run(*tf.nest.flatten(x))
    for variable, value in zip(updated, values):
        variable.assign(value)
    return y
