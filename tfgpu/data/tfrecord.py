"""``kind: tfrecord``: ``tf.train.Example`` records in TFRecord files, described by a feature spec in YAML.

``path`` (and ``validation_path``, ``test_path``) are file patterns
(``shards/train-*.tfrecord``), matched in sorted order. ``features`` maps each
feature name to ``{dtype, shape}`` (``tf.io.FixedLenFeature``) or to an encoded
image (``{encoding: png}``/``jpeg``: ``tf.io.decode_image``; ``{encoding: raw,
shape: [28, 28]}``: uint8 bytes, ``tf.io.decode_raw``); ``label`` names the label
feature. The input is the one other feature, or, when there are several, the
numeric ones flattened and concatenated in spec order.

Files are read with ``tf.data.Dataset.interleave`` over ``TFRecordDataset``s
(parallel, files reshuffled every epoch). Before training, the first record of
every file is parsed against the spec (a record that does not match is a data
error naming the file and what the record holds), and one pass over the labels
counts the records and checks the classes. ``validation_split`` holds out each
record by a hash of (file number, record number, seed): the same records
whatever the read order. The pure check (before TensorFlow starts) matches the
patterns and reads each file's first record header.
"""

from __future__ import annotations

import glob
import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import Any, Optional

from ..config import DataConfig, FeatureSpec
from ..errors import DataError
from ..utils.lazy import numpy as np
from .base import (Data, DataSpec, LoadContext, Reader, Source, Split, examples_hint, label_task, rescale_for,
                   resolve_path, tf_error_text)
from .image_folder import CHANNELS

_HASH_BUCKETS = 1_000_000


def match_files(pattern: str, key: str) -> tuple[str, ...]:
    """The files a pattern (or a file, or a folder's files) names, sorted.

    Raises:
        DataError: nothing matches, or a matched file is empty.
    """
    path = resolve_path(pattern, key)
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    else:
        files = sorted(f for f in glob.glob(str(path)) if Path(f).is_file())
    if not files:
        raise DataError(f"data.{key}: no files match '{pattern}' (looked from {Path.cwd()}).",
                        f"point data.{key} at the TFRecord files, e.g. 'shards/train-*.tfrecord'." + examples_hint(pattern))
    empty = [f for f in files if Path(f).stat().st_size == 0]
    if empty:
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise DataError(f"data.{key}: {empty[0]} is empty (0 bytes){more}.",
                        "re-write the file(s), or remove them from the pattern.")
    return tuple(files)


def compression_of(files: tuple[str, ...], setting: str) -> str:
    """``data.compression`` resolved: ``auto`` is GZIP for ``.gz`` files, ZLIB for ``.zz``, else none ("")."""
    if setting == "auto":
        suffixes = {Path(f).suffix.lower() for f in files}
        return "GZIP" if suffixes == {".gz"} else "ZLIB" if suffixes == {".zz"} else ""
    return "" if setting == "none" else setting


def check_framing(path: str, compression: str, key: str) -> None:
    """Read the first record's 12-byte header (length and its CRC slot) without TensorFlow.

    Raises:
        DataError: the file cannot be read (or decompressed), or is too short to hold a record.
    """
    try:
        if compression == "GZIP":
            with gzip.open(path, "rb") as f:
                head = f.read(12)
        elif compression == "ZLIB":
            with open(path, "rb") as f:
                head = zlib.decompressobj().decompress(f.read(1 << 16))[:12]
        else:
            with open(path, "rb") as f:
                head = f.read(12)
    except (OSError, EOFError, zlib.error) as exc:
        how = f" as {compression}" if compression else ""
        raise DataError(f"data.{key}: cannot read {path}{how}: {exc}.",
                        "check the file, and data.compression (auto, none, GZIP or ZLIB).") from None
    if len(head) < 12:
        raise DataError(f"data.{key}: {path} is too short to hold a TFRecord record ({len(head)} bytes"
                        f"{' after decompression' if compression else ''}).",
                        "the file is not a TFRecord file, or it is truncated; re-write it.")
    (length,) = struct.unpack("<Q", head[:8])
    if not compression and length > Path(path).stat().st_size:
        raise DataError(
            f"data.{key}: {path} does not start with a TFRecord record (its first length field says {length} bytes, "
            f"more than the file's {Path(path).stat().st_size}).",
            "point the pattern at TFRecord files (tf.io.TFRecordWriter); if they are compressed, set data.compression.",
        )


def describe_record(raw: bytes) -> str:
    """A record's features as they are stored, e.g. ``image: 1 bytes value; label: 1 int64 value``."""
    import tensorflow as tf  # noqa: PLC0415

    try:
        example = tf.train.Example.FromString(raw)
    except Exception:  # not an Example at all
        return "not a tf.train.Example"
    parts = []
    for name, feature in sorted(example.features.feature.items()):
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else []
        label = {"bytes_list": "bytes", "float_list": "float32", "int64_list": "int64"}.get(kind, "no")
        parts.append(f"{name}: {len(values)} {label} value{'s' if len(values) != 1 else ''}")
    return "; ".join(parts) or "no features"


def _spec_text(name: str, spec: FeatureSpec) -> str:
    if spec.encoding in ("png", "jpeg"):
        return f"{name}: one {spec.encoding} image (bytes)"
    if spec.encoding == "raw":
        return f"{name}: raw uint8 bytes of shape {spec.shape}"
    count = math.prod(spec.shape)
    return f"{name}: {spec.dtype} of shape {spec.shape} ({count} value{'s' if count != 1 else ''})"


class RecordReader(Reader):
    """Streams ``(x, y)`` parsed from TFRecord files (see the module doc)."""

    def __init__(self, files: tuple[str, ...], compression: str, cfg: DataConfig,
                 holdout: Optional[tuple[float, int, bool]] = None) -> None:
        self.files = files
        self.compression = compression
        self.cfg = cfg
        self.label = cfg.label
        self.inputs = [n for n in cfg.features if n != cfg.label]
        self.holdout = holdout  # (fraction, seed, keep the held-out records?)
        self.channels = CHANNELS[cfg.color_mode] if cfg.color_mode else 0
        self.image_shape: Optional[tuple[int, ...]] = None  # set by the source after the first record

    def parse_spec(self, names: Optional[list[str]] = None) -> dict[str, Any]:
        import tensorflow as tf  # noqa: PLC0415

        spec = {}
        for name in names or list(self.cfg.features):
            f = self.cfg.features[name]
            dtype = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}[f.dtype]
            spec[name] = tf.io.FixedLenFeature([] if f.encoding else f.shape, dtype)
        return spec

    def _feature(self, name: str, value: Any) -> Any:
        import tensorflow as tf  # noqa: PLC0415

        f = self.cfg.features[name]
        if f.encoding in ("png", "jpeg"):
            image = tf.io.decode_image(value, channels=self.channels, expand_animations=False)
            if self.cfg.image_size is not None:
                image = tf.image.resize(image, self.cfg.image_size, method=self.cfg.interpolation)
                image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
            if self.image_shape is not None:
                image = tf.ensure_shape(image, self.image_shape)
            return image
        if f.encoding == "raw":
            return tf.reshape(tf.io.decode_raw(value, tf.uint8), f.shape)
        return value

    def decode(self, record: Any) -> tuple[Any, Any]:
        """One serialized record -> ``(x, y)``."""
        import tensorflow as tf  # noqa: PLC0415

        parsed = tf.io.parse_single_example(record, self.parse_spec())
        xs = [self._feature(n, parsed[n]) for n in self.inputs]
        if len(xs) == 1:
            x = xs[0]
            if x.dtype == tf.int64:
                x = tf.cast(x, tf.float32)
        else:
            x = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in xs], axis=0)
        return x, parsed[self.label]

    def records(self, shuffle: bool = False, seed: Optional[int] = None,
                shard: Optional[tuple[int, int]] = None) -> Any:
        """The serialized records of this split (held-out ones filtered), one pass."""
        import tensorflow as tf  # noqa: PLC0415

        files = tf.data.Dataset.from_tensor_slices((list(self.files), np.arange(len(self.files), dtype=np.int64)))
        if shard is not None:
            files = files.shard(*shard)
        if shuffle:
            files = files.shuffle(len(self.files), seed=seed, reshuffle_each_iteration=True)
        compression = self.compression

        def read(path: Any, number: Any) -> Any:
            records = tf.data.TFRecordDataset(path, compression_type=compression)
            return records.enumerate().map(lambda i, r: (number, i, r))

        ds = files.interleave(read, cycle_length=max(1, min(len(self.files), 8)), block_length=16,
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
        if self.holdout is not None:
            fraction, split_seed, keep_held = self.holdout

            def held(number: Any, i: Any, _: Any) -> Any:
                key = tf.strings.format("{}:{}:{}", (number, i, split_seed))
                out = tf.strings.to_hash_bucket_fast(key, _HASH_BUCKETS) < int(fraction * _HASH_BUCKETS)
                return out if keep_held else tf.logical_not(out)

            ds = ds.filter(held)
        return ds.map(lambda number, i, r: r)

    def dataset(self, shuffle: bool, seed: Optional[int], shard: Optional[tuple[int, int]] = None) -> Any:
        import tensorflow as tf  # noqa: PLC0415

        return self.records(shuffle, seed, shard).map(self.decode, num_parallel_calls=tf.data.AUTOTUNE,
                                                      deterministic=not shuffle)

    def locate_error(self, error: BaseException) -> Optional[str]:
        import tensorflow as tf  # noqa: PLC0415

        for path in self.files:
            for number, raw in enumerate(tf.data.TFRecordDataset(path, compression_type=self.compression)):
                try:
                    self.decode(raw)
                except Exception as exc:  # the first record that does not decode
                    return (f"{path}, record {number + 1}: {tf_error_text(exc)} (the record holds "
                            f"{describe_record(raw.numpy())})")
        return None


class TfrecordSource(Source):
    """``kind: tfrecord`` (see the module doc)."""

    kind = "tfrecord"

    def check(self, keep: bool = True) -> None:
        cfg: DataConfig = self.cfg
        self.files: dict[str, tuple[str, ...]] = {}
        for key, split in (("path", "train"), ("validation_path", "validation"), ("test_path", "test")):
            pattern = getattr(cfg, key)
            if pattern is None:
                continue
            files = match_files(pattern, key)
            compression = compression_of(files, cfg.compression)
            for f in files:
                check_framing(f, compression, key)
            self.files[split] = files
        inputs = {n: s for n, s in cfg.features.items() if n != cfg.label}
        if len(inputs) > 1:
            images = [n for n, s in inputs.items() if s.encoding is not None or s.dtype == "string"]
            if images:
                raise DataError(
                    f"data.features: '{images[0]}' is an image or text feature beside other inputs; tfgpu feeds the "
                    "model one input: one image feature, or several numeric features (concatenated).",
                    "keep one image feature (plus the label), or use data.kind: builder for several inputs.",
                )
        elif next(iter(inputs.values())).dtype == "string" and next(iter(inputs.values())).encoding is None:
            raise DataError(f"data.features: '{next(iter(inputs))}' is a string feature without an encoding; the "
                            "model's input must be numbers or an image.",
                            "set encoding: png, jpeg or raw for image bytes, or give its numeric dtype.")
        label = cfg.features[cfg.label]
        if label.dtype == "string" or label.encoding is not None:
            raise DataError(f"data.features: the label '{cfg.label}' is a string; labels must be int64 class "
                            "numbers or float32 targets.", "store the label as int64 (classes) or float32 (values).")

    def _first_records(self, reader: RecordReader, key: str) -> Any:
        """Parse the first record of every file against the spec; return the first decoded input."""
        import tensorflow as tf  # noqa: PLC0415

        first_x = None
        for path in reader.files:
            raw = next(iter(tf.data.TFRecordDataset(path, compression_type=reader.compression).take(1)), None)
            if raw is None:
                raise DataError(f"data.{key}: {path} holds no records.", "re-write it, or leave it out of the pattern.")
            try:
                x, _ = reader.decode(raw)
            except Exception as exc:  # the spec does not match what is stored
                detail = tf_error_text(exc)
                expected = "; ".join(_spec_text(n, s) for n, s in self.cfg.features.items())
                raise DataError(
                    f"data.features: the first record of {path} does not match the spec ({detail}): the record holds "
                    f"{describe_record(raw.numpy())}, the spec says {expected}.",
                    "make data.features match what the files hold (names, dtype int64/float32/string, shape, "
                    "encoding).",
                ) from None
            if first_x is None:
                first_x = x.numpy()
        return first_x

    def _labels(self, reader: RecordReader) -> np.ndarray:
        """Every label of the split, read in one pass (only the label is parsed)."""
        import tensorflow as tf  # noqa: PLC0415

        spec = reader.parse_spec([reader.label])
        ds = reader.records().batch(4096).map(lambda r: tf.io.parse_example(r, spec)[reader.label])
        try:
            parts = [b for b in ds.as_numpy_iterator()]
        except Exception as exc:  # a record whose label does not parse
            where = reader.locate_error(exc) or tf_error_text(exc)
            raise DataError(f"data.label: a record's label does not match the spec: {where}.",
                            "make data.features match what the files hold.") from None
        return np.concatenate(parts) if parts else np.zeros((0,), np.float32)

    def load(self, context: LoadContext) -> Data:
        cfg: DataConfig = self.cfg
        compression = {s: compression_of(f, cfg.compression) for s, f in self.files.items()}
        readers: dict[str, RecordReader] = {}
        if cfg.validation_split is not None:
            files = self.files["train"]
            readers["train"] = RecordReader(files, compression["train"], cfg,
                                            (cfg.validation_split, self.split_seed, False))
            readers["validation"] = RecordReader(files, compression["train"], cfg,
                                                 (cfg.validation_split, self.split_seed, True))
        else:
            readers["train"] = RecordReader(self.files["train"], compression["train"], cfg)
        for split in ("validation", "test"):
            if split in self.files:
                readers[split] = RecordReader(self.files[split], compression[split], cfg)
        keys = {"train": "path", "validation": "validation_path" if "validation" in self.files else "path",
                "test": "test_path"}
        first = None
        for split, reader in readers.items():
            x = self._first_records(reader, keys[split])
            first = x if first is None else first
        shape = tuple(first.shape)
        for reader in readers.values():
            reader.image_shape = shape if first.dtype == np.uint8 and len(shape) == 3 else None
        labels = {split: self._labels(reader) for split, reader in readers.items()}
        for split, y in labels.items():
            if len(y) == 0:
                raise DataError(f"data.{keys[split]}: the {split} split has no records"
                                + (" after data.validation_split" if cfg.validation_split else "") + ".",
                                "check the files (and a validation_split that leaves records on both sides).")
        def files(reader: RecordReader) -> str:
            return f"{reader.files[0]}{f' (+{len(reader.files) - 1} files)' if len(reader.files) > 1 else ''}"

        task = label_task([(files(readers[s]), y) for s, y in labels.items()], self.loss, cfg.num_classes)
        origin = {s: files(r) for s, r in readers.items()}
        if cfg.validation_split is not None:
            origin["validation"] = f"validation_split {cfg.validation_split} of {files(readers['train'])} " \
                                   f"(seed {self.split_seed})"
        for split, reader in readers.items():
            reader.size = len(labels[split])
        splits = {s: Split(s, origin[s], reader=r, size=len(labels[s])) for s, r in readers.items()}
        validation, test = splits.get("validation"), splits.get("test")
        is_test = validation is None and test is not None
        if is_test:
            validation, test = Split("validation", test.origin + " (the test split)", reader=test.reader,
                                     size=test.size), None
        x_dtype = "uint8" if first.dtype == np.uint8 else "float32"
        grey = x_dtype == "uint8" and len(shape) == 2
        spec = DataSpec(kind="tfrecord", source=f"TFRecord {cfg.path}", sample_shape=shape, x_dtype=x_dtype,
                        add_channel=grey, rescale=rescale_for(cfg, x_dtype), task=task.task,
                        num_classes=task.num_classes, target_shape=tuple(labels["train"].shape[1:]),
                        label_dtype="int32" if task.task == "classification" else "float32",
                        details={"files": {s: len(r.files) for s, r in readers.items()},
                                 "compression": compression["train"] or "none", "inputs": readers["train"].inputs})
        return Data(splits["train"], validation, test, spec, validation_is_test=is_test)
