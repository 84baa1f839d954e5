"""``kind: builder``: your own ``tf.data`` (or NumPy) code, named as ``"package.module:function"``.

The function is imported and called after the devices are set up (so it may
import TensorFlow) with the keyword arguments it accepts among:

- ``global_batch_size``: samples per step over all replicas;
- ``input_context``: a ``tf.distribute.InputContext`` (``num_input_pipelines``,
  ``input_pipeline_id``, ``num_replicas_in_sync``,
  ``get_per_replica_batch_size``; one pipeline per worker). Do not shard:
  every worker builds the same dataset and tfgpu gives each its part of every
  global batch (auto-shard policy ``DATA``);
- ``seed``: ``tensorflow.seed`` (or ``None``);

plus ``data.builder_args``. The current directory is importable, as with
``python -m``. It returns ``(train, validation)``, ``(train, validation,
test)`` or a dict with those keys; validation and test may be ``None``. Each is
a ``tf.data.Dataset`` of ``(x, y)`` pairs, or a NumPy pair ``(x, y)``:

- NumPy pairs, and datasets with ``data.batched: false`` (the default), yield
  *single samples*: tfgpu shuffles, batches into global batches and prefetches
  them (NumPy pairs take the in-memory fast path);
- with ``data.batched: true`` the datasets yield *global batches* (of
  ``global_batch_size``), already shuffled as you want them; tfgpu only
  distributes and prefetches them.

A dataset must be finite (one epoch). Its size is its cardinality; when that
is unknown, tfgpu counts it once before training (``ds.apply(
tf.data.experimental.assert_cardinality(n))`` saves that pass).
"""

from __future__ import annotations

from typing import Any, Optional

from ..config import DataConfig
from ..errors import DataError
from ..utils.imports import import_function, keyword_arguments
from ..utils.lazy import numpy as np
from .arrays import arrange, check_pairs
from .base import Data, DataSpec, LoadContext, Reader, Source, Split, label_task, rescale_for

class DatasetReader(Reader):
    """A builder's unbatched ``tf.data.Dataset`` (read as given; the pipeline shuffles and batches)."""

    def __init__(self, dataset: Any, size: int) -> None:
        self.ds, self.size = dataset, size

    def dataset(self, shuffle: bool, seed: Optional[int], shard: Optional[tuple[int, int]] = None) -> Any:
        return self.ds if shard is None else self.ds.shard(*shard)


def _count(ds: Any, what: str) -> int:
    import tensorflow as tf  # noqa: PLC0415

    n = int(ds.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise DataError(f"data.builder: the {what} dataset is infinite (e.g. .repeat() without a count); tfgpu "
                        "needs one epoch, and repeats it itself.",
                        "return the dataset without .repeat().")
    if n >= 0:
        return n
    return int(ds.reduce(np.int64(0), lambda c, _: c + 1))


class BuilderSource(Source):
    """``kind: builder`` (see the module doc)."""

    kind = "builder"

    def load(self, context: LoadContext) -> Data:
        import tensorflow as tf  # noqa: PLC0415

        cfg: DataConfig = self.cfg
        func = import_function(cfg.builder, "data.builder", DataError, "the training and validation data")
        offered = {"global_batch_size": context.global_batch_size, "input_context": context.input_context(),
                   "seed": context.seed}
        kwargs = keyword_arguments(func, offered, cfg.builder_args)
        shown = ", ".join([*(k for k in kwargs if k not in cfg.builder_args),
                           *(f"{k}={v!r}" for k, v in cfg.builder_args.items())])
        call = f"{cfg.builder}({shown})"
        try:
            result = func(**kwargs)
        except SystemExit as exc:
            raise DataError(f"data.builder: {call} called sys.exit({exc.code!r}) instead of returning the data.",
                            "return the datasets; raise an exception to report a problem.") from None
        except Exception as exc:  # the builder's own error
            raise DataError(f"data.builder: {call} raised {type(exc).__name__}: {str(exc).strip() or 'no message'}.",
                            "fix the builder or data.builder_args (run with --debug for the traceback).") from exc
        parts = self._parts(result, call)
        if parts["train"] is None:
            raise DataError(f"data.builder: {call} returned no training data (train is None).",
                            "return the training dataset first.")
        kinds = {name: self._kind(value, name, call) for name, value in parts.items() if value is not None}
        if set(kinds.values()) == {"arrays"}:
            arrays = {}
            for name, role in (("train", "train"), ("validation", "val"), ("test", "test")):
                if parts.get(name) is not None:
                    arrays[f"x_{role}"], arrays[f"y_{role}"] = (np.asarray(a) for a in parts[name])
            check_pairs(arrays, f"data.builder: {call}")
            return arrange(self, arrays, f"builder {cfg.builder}", f"data.builder {cfg.builder}",
                           origins={"train": f"{call}: train", "val": f"{call}: validation",
                                    "test": f"{call}: test"})
        if "arrays" in kinds.values():
            raise DataError(f"data.builder: {call} returned a mix of datasets and NumPy arrays.",
                            "return tf.data.Datasets for every split, or NumPy (x, y) pairs for every split.")
        return self._from_datasets(parts, call, tf)

    @staticmethod
    def _parts(result: Any, call: str) -> dict[str, Any]:
        if isinstance(result, dict):
            unknown = [k for k in result if k not in ("train", "validation", "test")]
            if unknown or "train" not in result:
                raise DataError(f"data.builder: {call} returned a dict with keys {', '.join(map(str, result))}; "
                                "expected train, validation and test.",
                                "return {'train': ..., 'validation': ..., 'test': ...} (validation and test optional).")
            return {k: result.get(k) for k in ("train", "validation", "test")}
        if isinstance(result, (tuple, list)) and len(result) in (2, 3) and not all(
                isinstance(r, np.ndarray) for r in result):
            return dict(zip(("train", "validation", "test"), list(result) + [None] * (3 - len(result))))
        raise DataError(
            f"data.builder: {call} returned {type(result).__name__}"
            + (f" of {len(result)}" if isinstance(result, (tuple, list)) else "")
            + "; expected (train, validation), (train, validation, test) or a dict with those keys.",
            "return the training and validation data (tf.data.Datasets of (x, y), or NumPy (x, y) pairs).",
        )

    @staticmethod
    def _kind(value: Any, name: str, call: str) -> str:
        import tensorflow as tf  # noqa: PLC0415

        if isinstance(value, tf.data.Dataset):
            spec = value.element_spec
            if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)):
                raise DataError(f"data.builder: {call} returned a {name} dataset whose elements are {spec}; "
                                "tfgpu trains on (x, y) pairs of tensors.",
                                "map the dataset to (inputs, label) pairs, e.g. "
                                "ds.map(lambda d: (d['image'], d['label'])).")
            return "dataset"
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return "arrays"
        raise DataError(f"data.builder: {call} returned {type(value).__name__} as the {name} data.",
                        "return a tf.data.Dataset of (x, y) pairs, or a NumPy (x, y) pair.")

    def _from_datasets(self, parts: dict[str, Any], call: str, tf: Any) -> Data:
        cfg: DataConfig = self.cfg
        train = parts["train"]
        x_spec, y_spec = train.element_spec
        sample = tuple(x_spec.shape[1:] if cfg.batched else x_spec.shape)
        if any(d is None for d in sample):
            raise DataError(f"data.builder: the train dataset's inputs have shape {tuple(x_spec.shape)} with an "
                            "unknown size; tfgpu builds the model for one fixed input shape.",
                            "give the inputs a fixed shape (e.g. resize images), or set data.batched correctly.")
        splits: dict[str, Split] = {}
        labels = []
        for name, ds in parts.items():
            if ds is None:
                continue
            if tuple(ds.element_spec[0].shape[1:] if cfg.batched else ds.element_spec[0].shape) != sample:
                raise DataError(f"data.builder: the {name} inputs have shape {tuple(ds.element_spec[0].shape)} but "
                                f"the train inputs {tuple(x_spec.shape)}.",
                                "return inputs of one shape for every split.")
            size = _count(ds, name)
            if size == 0:
                raise DataError(f"data.builder: {call} returned an empty {name} dataset.", "return data in it.")
            if cfg.batched:
                splits[name] = Split(name, f"{call}: {name} (batched)", batches=lambda d=ds: d, size=size)
            else:
                splits[name] = Split(name, f"{call}: {name}", reader=DatasetReader(ds, size), size=size)
            head = ds.unbatch() if cfg.batched else ds
            labels.append((f"data.builder {name}", np.asarray(list(head.take(256).map(lambda x, y: y)
                                                                    .as_numpy_iterator()))))
        x_dtype = "uint8" if x_spec.dtype == tf.uint8 else "float32"
        # The first 256 labels of each split decide the task; the classes come from data.num_classes, else
        # from every label once the splits are read into memory (pipeline.materialize).
        task = label_task(labels, self.loss, cfg.num_classes)
        validation, test = splits.get("validation"), splits.get("test")
        spec = DataSpec(kind="builder", source=f"builder {cfg.builder}", sample_shape=sample, x_dtype=x_dtype,
                        add_channel=x_dtype == "uint8" and len(sample) == 2, rescale=rescale_for(cfg, x_dtype),
                        task=task.task, num_classes=cfg.num_classes,
                        target_shape=tuple(y_spec.shape[1:] if cfg.batched else y_spec.shape),
                        label_dtype="int32" if task.task == "classification" else "float32",
                        details={"batched": cfg.batched})
        return Data(splits["train"], validation, test, spec)
