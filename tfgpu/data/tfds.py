"""``kind: tfds``: a TensorFlow Datasets dataset, prepared in a ``data_dir``.

Needs the ``tfds`` extra (``pip install 'tfgpu[tfds]'``: ``tensorflow-datasets``).
The dataset is read with ``tfds.builder(name, data_dir=...).as_dataset(split=...)``
from its prepared files; nothing is downloaded at run time unless
``data.download: true`` (``builder.download_and_prepare()``). A dataset
prepared anywhere (``tfds build``, ``tfds.dataset_builders.store_as_tfds_dataset``,
or copied from another machine) is read by its name even when this TFDS
release does not know it.

``splits`` maps tfgpu's splits to TFDS split names, slicing included
(``{train: 'train[:90%]', validation: 'train[90%:]', test: test}``); by default
``train``, and ``validation`` and ``test`` where the dataset has them. The
input is the dataset's supervised input (``as_supervised``) or ``features``;
the label its supervised label or ``label``. Class names come from a
``ClassLabel`` feature.

The pure check (before TensorFlow starts) looks for the package and for the
prepared dataset's ``dataset_info.json`` under ``data_dir``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Optional

from ..config import DataConfig
from ..errors import DataError
from ..utils.lazy import numpy as np
from .base import (Data, DataSpec, LoadContext, Source, Split, examples_hint, label_task, rescale_for, resolve_path,
                   tf_error_text)
from .builder import DatasetReader

DEFAULT_DATA_DIR = "~/tensorflow_datasets"


def data_dir_of(cfg: DataConfig) -> Path:
    """``data.data_dir``, else ``$TFDS_DATA_DIR``, else TFDS's default ``~/tensorflow_datasets``."""
    if cfg.data_dir is not None:
        return resolve_path(cfg.data_dir, "data_dir")
    return Path(os.environ.get("TFDS_DATA_DIR") or DEFAULT_DATA_DIR).expanduser()


def _folder(name: str) -> tuple[str, Optional[str]]:
    """``"mnist/config:3.0.1"`` -> ``("mnist/config", "3.0.1")``."""
    base, _, version = name.partition(":")
    return base, version or None


class TfdsSource(Source):
    """``kind: tfds`` (see the module doc)."""

    kind = "tfds"

    def check(self, keep: bool = True) -> None:
        cfg: DataConfig = self.cfg
        if importlib.util.find_spec("tensorflow_datasets") is None:
            raise DataError(
                "data.kind tfds needs the tensorflow-datasets package, which is not installed.",
                "pip install 'tfgpu[tfds]' (tensorflow-datasets), or use another data.kind.",
            )
        root = data_dir_of(cfg)
        if cfg.download:
            return
        base, version = _folder(cfg.name)
        folder = root / base
        infos = sorted(folder.glob(f"{version or '*'}/dataset_info.json")) if folder.is_dir() else []
        if not infos:
            have = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "downloads") \
                if root.is_dir() else []
            state = "is empty" if root.is_dir() else "does not exist"
            where = f"{root} holds {', '.join(have[:12])}" if have else f"{root} {state}"
            raise DataError(
                f"data.name: the TFDS dataset '{cfg.name}' is not prepared in {root} (no {base}/"
                f"{version or '<version>'}/dataset_info.json; {where}); tfgpu does not download at run time.",
                "prepare it there first (tfds build, or download_and_prepare on a machine with network, then copy "
                "the folder), set data.data_dir to where it is, or set data.download: true to download it now."
                + examples_hint(cfg.data_dir),
            )

    def load(self, context: LoadContext) -> Data:
        import tensorflow_datasets as tfds  # noqa: PLC0415

        cfg: DataConfig = self.cfg
        root = data_dir_of(cfg)
        try:
            builder = tfds.builder(cfg.name, data_dir=str(root))
            if cfg.download and not builder.is_prepared():
                builder.download_and_prepare()
        except Exception as exc:  # DatasetNotFoundError, download and preparation errors
            raise DataError(f"data.name: TFDS cannot open '{cfg.name}' in {root}: {type(exc).__name__}: "
                            f"{tf_error_text(exc)}.",
                            "check data.name and data.data_dir (the folder holding <name>/<version>/).") from None
        info = builder.info
        available = list(info.splits.keys())
        splits = dict(cfg.splits) if cfg.splits else {"train": "train"}
        if not cfg.splits:
            for role in ("validation", "test"):
                if role in available:
                    splits[role] = role
        label, inputs = self._keys(info)
        parts: dict[str, Split] = {}
        for role, split in splits.items():
            try:
                size = int(info.splits[split].num_examples)
                ds = builder.as_dataset(split=split, shuffle_files=False)
            except Exception as exc:  # an unknown split name or a bad slice
                raise DataError(f"data.splits.{role}: '{split}' is not a split of {cfg.name} "
                                f"({tf_error_text(exc)}); its splits are {', '.join(available)}.",
                                "name a split it has; slices such as 'train[:90%]' are allowed.") from None
            if size == 0:
                raise DataError(f"data.splits.{role}: '{split}' of {cfg.name} holds no examples.",
                                "choose a split (or slice) with examples in it.")
            parts[role] = Split(role, f"TFDS {cfg.name} {split}", reader=DatasetReader(self._pairs(ds, label, inputs),
                                                                                     size), size=size)
        x_spec, y_spec = parts["train"].reader.ds.element_spec
        if any(d is None for d in x_spec.shape):
            raise DataError(f"data.features: {cfg.name}'s inputs have shape {tuple(x_spec.shape)}, which varies "
                            "between examples; tfgpu builds the model for one fixed shape.",
                            "use kind: builder with a function that loads it with tfds and resizes the images.")
        label_feature = info.features[label] if label in info.features else None
        class_names = tuple(label_feature.names) if hasattr(label_feature, "names") else None
        head = np.asarray(list(parts["train"].reader.ds.take(256).map(lambda x, y: y).as_numpy_iterator()))
        task = label_task([(f"TFDS {cfg.name}", head)], self.loss, cfg.num_classes or
                          (len(class_names) if class_names else None))
        x_dtype = "uint8" if x_spec.dtype.name == "uint8" else "float32"
        spec = DataSpec(kind="tfds", source=f"TFDS {cfg.name} in {root}", sample_shape=tuple(x_spec.shape),
                        x_dtype=x_dtype, add_channel=x_dtype == "uint8" and len(x_spec.shape) == 2,
                        rescale=rescale_for(cfg, x_dtype), task=task.task,
                        num_classes=task.num_classes if task.task == "classification" else None,
                        class_names=class_names, target_shape=tuple(y_spec.shape),
                        label_dtype="int32" if task.task == "classification" else "float32",
                        details={"tfds_splits": splits, "label": label, "inputs": inputs,
                                 "version": str(info.version)})
        validation, test = parts.get("validation"), parts.get("test")
        is_test = validation is None and test is not None
        if is_test:
            validation, test = Split("validation", f"{test.origin} (the test split)", reader=test.reader,
                                     size=test.size), None
        return Data(parts["train"], validation, test, spec, validation_is_test=is_test)

    def _keys(self, info: Any) -> tuple[str, list[str]]:
        """The label feature and the input features: ``data.label``/``features``, else the supervised keys."""
        cfg: DataConfig = self.cfg
        names = sorted(info.features.keys()) if hasattr(info.features, "keys") else []
        supervised = info.supervised_keys if isinstance(info.supervised_keys, tuple) else None
        label = cfg.label or (supervised[1] if supervised else ("label" if "label" in names else None))
        inputs = list(cfg.features) if cfg.features else (
            [supervised[0]] if supervised else [n for n in names if n != label])
        missing = [n for n in [label, *inputs] if n is None or n not in names]
        if missing or not inputs:
            raise DataError(
                f"data.label/data.features: {cfg.name}'s features are {', '.join(names)}; "
                + (f"'{missing[0]}' is not one of them" if missing and missing[0] else "no label feature was found")
                + ".", "set data.label to the label feature and data.features to the input feature(s).")
        return label, inputs

    @staticmethod
    def _pairs(ds: Any, label: str, inputs: list[str]) -> Any:
        import tensorflow as tf  # noqa: PLC0415

        def pick(example: Any) -> tuple[Any, Any]:
            if len(inputs) == 1:
                return example[inputs[0]], example[label]
            return tf.concat([tf.reshape(tf.cast(example[n], tf.float32), [-1]) for n in inputs], 0), example[label]

        return ds.map(pick, num_parallel_calls=tf.data.AUTOTUNE)
