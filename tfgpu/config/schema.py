"""The configuration schema: every section, key, default and check (no I/O, no TensorFlow).

Each section is a strict pydantic model: unknown keys are errors and values are
not coerced between types. Each key is documented in its section's
``Attributes:`` block; ``docs/config.md`` and ``docs/data.md`` are the user's
reference for the same keys.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, TypeAdapter,
                      ValidationError, ValidationInfo, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from .messages import requirement, short_repr


def _import_path(value: str) -> str:
    if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", value):
        raise ValueError(f"{value!r} is not 'package.module:function'")
    return value


#: ``"package.module:function"`` (``model.builder``, ``data.builder``).
ImportPath = Annotated[str, AfterValidator(_import_path)]


#: The checks of one memory cap (``devices.memory_limit_mib`` / ``memory_fraction``).
_CAPS = {
    "memory_limit_mib": TypeAdapter(Annotated[int, Field(gt=0, strict=True)]),
    "memory_fraction": TypeAdapter(Annotated[float, Field(gt=0, le=1, strict=True)]),
}


def _validated(adapter: TypeAdapter, value: Any) -> Any:
    """``adapter``'s value, or its first error raised again with the same type and ``ctx``."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise PydanticCustomError(error["type"], error["msg"], error.get("ctx")) from None


class _Section(BaseModel):
    """Strict base: unknown keys are errors, no silent type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class DevicesConfig(_Section):
    """Which devices TensorFlow sees and how their memory is managed.

    Attributes:
        visible_gpus: ``"all"`` (default), ``"none"`` (CPU only), or a list of
            GPU indices, e.g. ``[0, 2]``. Indices count the GPUs this process can
            see (after any ``CUDA_VISIBLE_DEVICES`` already set), in PCI bus
            order, as ``nvidia-smi`` numbers them. Becomes
            ``CUDA_VISIBLE_DEVICES`` (and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
        memory_growth: allocate GPU memory as needed instead of all at start
            (``tf.config.experimental.set_memory_growth``). ``null`` (default)
            means on, unless a memory limit, fraction or logical split is set.
            One value for every GPU: TensorFlow refuses growth that differs
            between GPUs, so a list or mapping is an error that says so.
        memory_limit_mib: cap each visible GPU at this many MiB
            (``tf.config.set_logical_device_configuration``); or a list with
            one cap per visible GPU, in their order, for GPUs of different sizes.
        memory_fraction: cap each visible GPU at this fraction (0, 1] of its
            own total memory (a MIG instance's: the instance's), read through
            NVML; or a list with one fraction per visible GPU.
        gpu_logical_devices: split each visible GPU into this many logical
            devices, each with an equal share of the limit.
        cpu_logical_devices: split the CPU into this many logical devices
            (for multi-replica training without GPUs).
        soft_placement: let ops requested on a missing device run elsewhere
            (``tf.config.set_soft_device_placement``).
        log_device_placement: print the device every op runs on
            (``tf.debugging.set_log_device_placement``).
    """

    visible_gpus: Union[Literal["all", "none"], list[int]] = "all"
    memory_growth: Optional[bool] = None
    memory_limit_mib: Optional[Union[int, list[int]]] = None
    memory_fraction: Optional[Union[float, list[float]]] = None
    gpu_logical_devices: int = Field(1, ge=1, le=64)
    cpu_logical_devices: int = Field(1, ge=1, le=256)
    soft_placement: bool = True
    log_device_placement: bool = False

    @field_validator("visible_gpus", mode="before")
    @classmethod
    def _check_visible(cls, value: Any) -> Any:
        if value in ("all", "none"):
            return value
        if isinstance(value, list):
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
                raise ValueError("each GPU index must be an integer >= 0")
            dupes = sorted({i for i in value if value.count(i) > 1})
            if dupes:
                raise ValueError(f"GPU index {dupes[0]} is listed twice")
            return value
        raise ValueError('expected "all", "none" or a list of GPU indices such as [0, 1]')

    @field_validator("memory_growth", mode="before")
    @classmethod
    def _check_growth(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple, dict)):
            raise ValueError(
                "memory growth is one setting for every GPU: TensorFlow refuses to start when it differs "
                "between GPUs ('Memory growth cannot differ between GPU devices'); set true or false, and to "
                "give GPUs of different sizes different amounts, cap each one with a list in "
                "devices.memory_limit_mib or devices.memory_fraction"
            )
        return value

    @field_validator("memory_limit_mib", "memory_fraction", mode="wrap")
    @classmethod
    def _check_cap(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        """A scalar is checked as before (pydantic's own errors: greater than 0, ...); a
        list is one cap per visible GPU, each checked the same way."""
        adapter = _CAPS[info.field_name]
        if value is None:
            return None
        if not isinstance(value, list):
            return _validated(adapter, value)
        if not value:
            raise ValueError("an empty list caps no GPU; give one value per visible GPU, or one value for all")
        for i, item in enumerate(value):
            if item is None:
                raise ValueError(
                    f"entry {i} is null, so that GPU would grow while the others are capped: TensorFlow cannot "
                    "mix the two (with any GPU capped it ignores memory growth, and the uncapped GPU takes all "
                    "of its memory at start); give every visible GPU a cap (for a whole GPU, "
                    "devices.memory_fraction 1.0), or leave both keys unset for memory growth everywhere"
                )
            try:
                adapter.validate_python(item)
            except ValidationError as exc:
                raise ValueError(f"entry {i} ({short_repr(item)}): {requirement(exc.errors()[0])}") from None
        return list(value)

    @model_validator(mode="after")
    def _check_memory(self) -> "DevicesConfig":
        if self.memory_limit_mib is not None and self.memory_fraction is not None:
            raise ValueError(
                "memory_limit_mib and memory_fraction are both set; set one of them: "
                "a limit in MiB, or a fraction of each GPU's total memory"
            )
        limited = self.memory_limit_mib is not None or self.memory_fraction is not None
        if self.gpu_logical_devices > 1 and not limited:
            raise ValueError(
                "gpu_logical_devices > 1 needs a memory size to split: set memory_limit_mib "
                "(per physical GPU) or memory_fraction; each logical GPU gets an equal share"
            )
        return self


class TensorflowConfig(_Section):
    """TensorFlow's other process settings.

    Attributes:
        log_level: TensorFlow's C++ log level, 0 (all) to 3 (errors only).
            Becomes ``TF_CPP_MIN_LOG_LEVEL``; left unset, an existing value in
            the environment is kept, else 2 (0 when ``log_device_placement``
            is on: the placement lines are INFO messages).
        onednn_opts: oneDNN's fused CPU kernels (``TF_ENABLE_ONEDNN_OPTS``);
            ``null`` leaves TensorFlow's default (on for x86 CPUs). Off, ops
            keep their plain names (``MatMul``, not ``_MklMatMul``) in logs.
        gpu_allocator: ``default`` or ``cuda_malloc_async``; becomes
            ``TF_GPU_ALLOCATOR``.
        mixed_precision: Keras dtype policy: ``float32``, ``mixed_float16``,
            ``mixed_bfloat16`` (``keras.mixed_precision.set_global_policy``)
            or ``auto``, resolved by the plan from the probe
            (:func:`tfgpu.devices.plan_base.resolve_precision`): ``mixed_bfloat16`` on
            GPUs of compute capability >= 8.0 (the lowest decides) and on CPUs
            with ``avx512_bf16`` or ``amx_bf16``, ``mixed_float16`` on 7.x GPUs,
            else ``float32``; the choice and its reason go into ``summary.json``.
        jit_compile: XLA for each replica's training step: ``auto``, ``true``
            or ``false``. ``auto`` is resolved per device kind by the plan
            (:func:`tfgpu.devices.plan.resolve_jit`): off on CPUs (measured: XLA made
            the seed model's step 2.8-4.4x slower on a 2-core x86 CPU); on
            GPUs what Keras's own ``"auto"`` gives: off under any
            ``tf.distribute`` strategy (one GPU's ``OneDeviceStrategy``
            included), on only with ``distribute.strategy: default``; the
            choice and its reason go into ``summary.json``.
        seed: seed for Python, NumPy and TensorFlow
            (``keras.utils.set_random_seed``); ``null`` for none.
        deterministic_ops: make ops deterministic
            (``tf.config.experimental.enable_op_determinism``).
        intra_op_threads: threads inside one op; 0 lets TensorFlow choose.
        inter_op_threads: ops run in parallel; 0 lets TensorFlow choose.
    """

    log_level: int = Field(2, ge=0, le=3)
    onednn_opts: Optional[bool] = None
    gpu_allocator: Literal["default", "cuda_malloc_async"] = "default"
    mixed_precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    jit_compile: Union[Literal["auto"], bool] = "auto"
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 1)
    deterministic_ops: bool = False
    intra_op_threads: int = Field(0, ge=0, le=1024)
    inter_op_threads: int = Field(0, ge=0, le=1024)

    @field_validator("jit_compile", mode="before")
    @classmethod
    def _check_jit(cls, value: Any) -> Any:
        if value == "auto" or isinstance(value, bool):
            return value
        raise ValueError("expected auto, true or false")


class ClusterConfig(_Section):
    """An explicit multi-worker cluster (``distribute.cluster``).

    Attributes:
        workers: every worker's ``host:port``, the same list on every machine;
            worker 0 is the chief.
        task_index: which of them this process is (set it per machine:
            ``--set distribute.cluster.task_index=1``).
    """

    workers: list[str] = Field(min_length=1)
    task_index: Optional[int] = Field(None, ge=0)

    @field_validator("workers")
    @classmethod
    def _check_workers(cls, value: list[str]) -> list[str]:
        for address in value:
            if not re.fullmatch(r"[\w.-]+:\d{1,5}", address) or not 0 < int(address.rsplit(":", 1)[1]) <= 65535:
                raise ValueError(f"{address!r} is not 'host:port' (port 1-65535), e.g. 'node1:12345'")
        if len(set(value)) != len(value):
            raise ValueError("a worker is listed twice")
        return value

    @model_validator(mode="after")
    def _check_index(self) -> "ClusterConfig":
        if self.task_index is not None and self.task_index >= len(self.workers):
            raise PydanticCustomError(
                "key_error", "{index} is not a worker's index: {count} worker(s) are listed, so it is 0 to {last}",
                {"loc": ("task_index",), "index": self.task_index, "count": len(self.workers),
                 "last": len(self.workers) - 1})
        return self


class DistributeConfig(_Section):
    """The ``tf.distribute`` strategy.

    Attributes:
        strategy: ``auto`` (MirroredStrategy when there is more than one
            replica, else OneDeviceStrategy; MultiWorkerMirroredStrategy with
            ``--workers N``), ``mirrored``, ``one_device``,
            ``multi_worker_mirrored`` or ``default`` (no strategy: TensorFlow's
            default).
        devices: explicit devices for ``mirrored`` (e.g. ``["/gpu:0",
            "/gpu:1"]`` or ``["/cpu:0", "/cpu:1"]``) or the one device for
            ``one_device``; ``null`` picks every visible (logical) device.
        cross_device_ops: how MirroredStrategy's replicas sum gradients:
            ``auto``, ``nccl``, ``hierarchical_copy`` or ``reduce_to_one_device``.
            NCCL falls back to another with a warning where it cannot work
            (CPU, logical GPUs).
        communication: how MultiWorkerMirroredStrategy's collectives run:
            ``auto``, ``ring`` (gRPC) or ``nccl`` (GPUs).
        cluster: an explicit cluster (:class:`ClusterConfig`); ``null``: from
            ``TF_CONFIG``, else Slurm, else one local worker.
        port: the first worker port on each Slurm node, and the port of
            ``tfgpu export``'s workers.
    """

    strategy: Literal["auto", "mirrored", "one_device", "multi_worker_mirrored", "default"] = "auto"
    devices: Optional[list[str]] = None
    cross_device_ops: Literal["auto", "nccl", "hierarchical_copy", "reduce_to_one_device"] = "auto"
    communication: Literal["auto", "ring", "nccl"] = "auto"
    cluster: Optional[ClusterConfig] = None
    port: int = Field(8888, ge=1, le=65535)

    @field_validator("devices")
    @classmethod
    def _check_devices(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is None:
            return value
        if not value:
            raise ValueError("the device list is empty; give at least one device or null")
        pattern = re.compile(r"^(/job:\w+/replica:\d+/task:\d+)?/?(device:)?(cpu|gpu):\d+$", re.I)
        for name in value:
            if not pattern.match(name):
                raise ValueError(f"{name!r} is not a device name; expected e.g. '/gpu:0' or '/cpu:1'")
        normalised = [normalise_device(name) for name in value]
        if len(set(normalised)) != len(normalised):
            raise ValueError("a device is listed twice")
        return value


def normalise_device(name: str) -> str:
    """``'/device:GPU:1'``, ``'gpu:1'`` -> ``'/gpu:1'`` (the form tfgpu prints)."""
    match = re.search(r"(cpu|gpu):(\d+)$", name, re.I)
    if not match:
        raise ValueError(f"not a device name: {name!r}")
    return f"/{match.group(1).lower()}:{int(match.group(2))}"


#: ``data.kind`` values, in the order the docs list them.
DATA_KINDS = ("mnist", "keras", "arrays", "image_folder", "csv", "tfrecord", "builder", "tfds")
#: Data kinds that read their files with TensorFlow on either backend, and how (with ``backend: jax``
#: they need TensorFlow installed beside JAX; ``tfgpu doctor`` and the JAX data path say so).
NEEDS_TENSORFLOW = {"image_folder": "decodes its images with tf.io.decode_image",
                    "tfrecord": "parses its records with tf.data and tf.io",
                    "tfds": "reads TensorFlow Datasets through tf.data"}
#: The Keras built-in datasets ``kind: keras`` reads (``kind: mnist`` is the first).
KERAS_DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100")
#: Roles of arrays in an ``arrays`` source; ``data.keys`` renames them.
ARRAY_ROLES = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")
#: ``data.keys.sample_weight``: the array of per-sample training weights (only when named).
SAMPLE_WEIGHT_ROLE = "sample_weight"
#: ``tf.image.resize`` methods (``data.interpolation``).
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic")

_COMMON_DATA_KEYS = ("kind", "rescale", "normalize", "shuffle_buffer", "cache", "seed", "validation_split",
                     "augment", "augment_on")
_IMAGE_KEYS = ("image_size", "color_mode", "interpolation")
#: The keys each kind reads (besides the common ones); any other key set is an error.
DATA_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "mnist": ("name", "path"),
    "keras": ("name", "path", "label_mode"),
    "arrays": ("path", "keys", "num_classes"),
    "image_folder": ("path", "validation_path", "test_path", *_IMAGE_KEYS),
    "csv": ("path", "validation_path", "test_path", "label", "features", "delimiter", "num_classes", "sample_weight"),
    "tfrecord": ("path", "validation_path", "test_path", "features", "label", "compression", *_IMAGE_KEYS,
                 "num_classes"),
    "builder": ("builder", "builder_args", "batched", "num_classes"),
    "tfds": ("name", "data_dir", "splits", "download", "label", "features", "num_classes"),
}
#: Keys a kind cannot do without, with what they are for (the error message's words).
DATA_REQUIRED: dict[str, tuple[tuple[str, str], ...]] = {
    "keras": (("name", f"the dataset: {', '.join(KERAS_DATASETS)}"),),
    "arrays": (("path", "a .npz file, or a folder of .npy files named by their role (x_train.npy, y_train.npy, ...)"),),
    "image_folder": (("path", "the folder with one sub-folder of images per class"),),
    "csv": (("path", "the CSV file"), ("label", "the name of the target column")),
    "tfrecord": (("path", "a file pattern such as 'shards/train-*.tfrecord'"),
                 ("features", "the feature spec: name -> {dtype, shape} or {encoding: png}"),
                 ("label", "which feature is the label")),
    "builder": (("builder", "'package.module:function' returning the datasets"),),
    "tfds": (("name", "the TensorFlow Datasets name, e.g. mnist (or mnist:3.0.1)"),),
}


def _kind_error(key: str, message: str) -> PydanticCustomError:
    """An error of the data section located at ``data.<key>`` (messages.py reads ``ctx['loc']``).

    ``message`` is final text: pydantic replaces only ``{loc}`` in it.
    """
    return PydanticCustomError("key_error", message, {"loc": (key,)})


class FeatureSpec(_Section):
    """One feature of a ``tf.train.Example`` record (``kind: tfrecord``).

    Attributes:
        dtype: how the feature is stored: ``float32`` (FloatList), ``int64``
            (Int64List) or ``string`` (BytesList). Becomes
            ``tf.io.FixedLenFeature(shape, dtype)``.
        shape: the feature's shape in one record: ``[]`` for a scalar,
            ``[30]`` for 30 floats, ``[28, 28]`` for 784 values (row-major).
        encoding: the feature holds one encoded image (a ``string`` of
            ``shape: []``): ``png``, ``jpeg`` (decoded with
            ``tf.io.decode_image``, then resized to ``data.image_size`` if
            set), or ``raw``: uint8 bytes (``tf.io.decode_raw``) reshaped to
            ``shape``.
    """

    dtype: Literal["float32", "int64", "string"] = "float32"
    shape: list[int] = Field(default_factory=list)
    encoding: Optional[Literal["png", "jpeg", "raw"]] = None

    @field_validator("shape", mode="before")
    @classmethod
    def _check_shape(cls, value: Any) -> Any:
        if isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value):
            return value
        raise ValueError("expected a list of sizes >= 1, e.g. [] for a scalar, [30] or [28, 28]")

    @model_validator(mode="after")
    def _check_encoding(self) -> "FeatureSpec":
        if self.encoding in ("png", "jpeg"):
            if "dtype" in self.model_fields_set and self.dtype != "string":
                raise ValueError(f"an encoded image (encoding: {self.encoding}) is stored as a string, "
                                 f"not {self.dtype}; remove dtype")
            if self.shape:
                raise ValueError(f"an encoded image (encoding: {self.encoding}) is one string per record "
                                 "(shape []); its pixel shape comes from the image (or data.image_size)")
        if self.encoding == "raw" and not self.shape:
            raise ValueError("encoding: raw needs the shape the bytes are reshaped to, e.g. shape: [28, 28]")
        if self.encoding is not None:
            self.dtype = "string"
        return self


class DataConfig(_Section):
    """Where the data comes from and how it is fed (``docs/data.md`` documents every key).

    Attributes:
        kind: the source: ``mnist`` (default), ``keras``, ``arrays``,
            ``image_folder``, ``csv``, ``tfrecord``, ``builder`` or ``tfds``.
            Unset, a ``name`` other than ``mnist`` selects ``keras``.
        name: ``mnist``/``keras``: the Keras built-in dataset (``mnist``,
            ``fashion_mnist``, ``cifar10``, ``cifar100``); ``tfds``: the
            TensorFlow Datasets name (``mnist``, ``mnist:3.0.1``).
        path: the training data (file, folder or file pattern, by kind). A
            relative path is read from the current directory; ``$VAR`` and
            ``${VAR}`` are expanded (e.g. ``${TFGPU_DATA_DIR}/breast_cancer/breast_cancer.csv``).
            ``mnist``/``keras`` without it: ``$TFGPU_DATA_DIR/<name>/``, else
            the Keras download.
        validation_path, test_path: the validation and test data, in the same
            form as ``path`` (``image_folder``, ``csv``, ``tfrecord``).
        validation_split: a fraction in (0, 1) of the training samples held
            out for validation, chosen at random with ``seed``. Without it or
            ``validation_path``, the source's own validation split is used,
            else its test split, else there is no validation.
        seed: the seed of ``validation_split``; ``null``: ``tensorflow.seed``,
            else 0. The same seed always gives the same split.
        image_size: ``[height, width]`` (or one number for a square) the
            images are resized to (``tf.image.resize``); ``null``: the images'
            own size, which must then be the same for all.
        color_mode: ``grayscale``, ``rgb`` or ``rgba`` (1, 3 or 4 channels,
            ``tf.io.decode_image(channels=...)``); ``null``: the images' own
            channels, which must then be the same for all.
        interpolation: the ``tf.image.resize`` method for ``image_size``.
        keys: ``arrays``: the names of the arrays in the ``.npz`` (or the
            ``.npy`` file stems) for each role, e.g. ``{x_train: features,
            y_train: target}``; roles: x_train, y_train, x_val, y_val,
            x_test, y_test, and ``sample_weight``: a 1-D array of per-sample
            training weights (read only when named here).
        label: ``csv``: the target column; ``tfrecord``, ``tfds``: the label
            feature (``tfds`` default: the supervised label, else ``label``).
        sample_weight: ``csv``: the column of per-sample training weights
            (numbers >= 0; not a feature). Training batches become
            ``(x, y, w)`` (``fit``'s ``sample_weight``); validation and test
            are not weighted. ``arrays`` names its array in ``keys`` instead.
        features: ``csv``: the feature columns, in order (default: every
            column but the label); ``tfrecord``: the feature spec, a mapping
            name -> :class:`FeatureSpec` (every feature but the label is an
            input); ``tfds``: the input feature(s) (default: the supervised input).
        delimiter: ``csv``: the field separator.
        compression: ``tfrecord``: ``auto`` (``GZIP`` for ``.gz`` files,
            ``ZLIB`` for ``.zz``, else none), ``none``, ``GZIP`` or ``ZLIB``.
        label_mode: ``cifar100``: ``fine`` (100 classes) or ``coarse`` (20).
        num_classes: the number of classes; ``null``: from the data (class
            folders, or the largest integer label + 1). Labels must lie in
            ``[0, num_classes)``.
        data_dir: ``tfds``: the folder of prepared TFDS datasets; ``null``:
            ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``.
        splits: ``tfds``: tfgpu's splits (``train``, ``validation``, ``test``)
            -> TFDS split names, slicing allowed (``train[:90%]``); default:
            ``train``, and ``validation``/``test`` where the dataset has them.
        download: ``tfds``: download and prepare the dataset at run time if it
            is not prepared (``builder.download_and_prepare()``).
        builder: ``builder``: ``"package.module:function"`` returning the data.
        builder_args: keyword arguments for ``builder``.
        batched: ``builder``: the datasets it returns already yield global
            batches (``global_batch_size``); else tfgpu shuffles and batches them.
        rescale: multiply inputs by this in the input pipeline: a number,
            ``'1/255'``, ``null`` (none) or ``auto``: 1/255 for 8-bit images
            (uint8 data), none otherwise.
        normalize: put a ``keras.layers.Normalization`` adapted on the
            training inputs at the model's input, so ``model.keras`` takes raw
            features.
        shuffle_buffer: samples in the shuffle buffer; ``null``: all of them
            (in memory), 10,000 (streamed).
        cache: ``true`` (memory): streamed sources are decoded once, before
            training, into memory; ``false``: read and decoded every epoch; a
            file path: ``tf.data.Dataset.cache(path)`` on disk.
        augment: Keras image preprocessing layers applied to training
            batches only, each ``ClassName`` or ``{ClassName: {args}}``
            (``RandomFlip``, ``{RandomRotation: {factor: 0.05}}``, ...), seeded
            from ``tensorflow.seed`` (:mod:`tfgpu.data.augment`).
        augment_on: ``pipeline`` (in the ``tf.data`` pipeline, on the CPU, in
            parallel) or ``model`` (the model's first layers, active in training only).
    """

    kind: Literal[DATA_KINDS] = "mnist"
    name: Optional[str] = None
    path: Optional[str] = None
    validation_path: Optional[str] = None
    test_path: Optional[str] = None
    validation_split: Optional[float] = Field(None, gt=0, lt=1)
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 1)
    image_size: Optional[list[int]] = None
    color_mode: Optional[Literal["grayscale", "rgb", "rgba"]] = None
    interpolation: Literal[INTERPOLATIONS] = "bilinear"
    keys: dict[str, str] = Field(default_factory=dict)
    label: Optional[str] = None
    sample_weight: Optional[str] = None
    features: Optional[Annotated[
        Union[Annotated[list[str], Tag("list")], Annotated[dict[str, FeatureSpec], Tag("dict")]],
        Discriminator(lambda v: "list" if isinstance(v, list) else "dict"),
    ]] = None
    delimiter: str = ","
    compression: Literal["auto", "none", "GZIP", "ZLIB"] = "auto"
    label_mode: Literal["fine", "coarse"] = "fine"
    num_classes: Optional[int] = Field(None, ge=2, le=2**24)
    builder: Optional[ImportPath] = None
    builder_args: dict[str, Any] = Field(default_factory=dict)
    batched: bool = False
    data_dir: Optional[str] = None
    splits: dict[str, str] = Field(default_factory=dict)
    download: bool = False
    rescale: Union[Literal["auto"], float, None] = "auto"
    normalize: bool = False
    shuffle_buffer: Optional[int] = Field(None, ge=1)
    cache: Union[bool, str] = True
    augment: Optional[list[Any]] = None
    augment_on: Literal["pipeline", "model"] = "pipeline"

    @model_validator(mode="before")
    @classmethod
    def _kind_from_name(cls, data: Any) -> Any:
        # data: {name: cifar10} (no kind) means the Keras built-in, as data: {name: mnist} always did.
        if isinstance(data, dict) and "kind" not in data and data.get("name") in KERAS_DATASETS[1:]:
            return {**data, "kind": "keras"}
        return data

    @field_validator("image_size", mode="before")
    @classmethod
    def _check_image_size(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value, value]
        if value is None or (isinstance(value, list) and len(value) == 2 and all(
                isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 65536 for d in value)):
            return value
        raise ValueError("expected [height, width] in pixels (each 1-65536), or one number for a square")

    @field_validator("keys")
    @classmethod
    def _check_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for role, name in value.items():
            if role not in ARRAY_ROLES and role != SAMPLE_WEIGHT_ROLE:
                raise ValueError(f"{role!r} is not an array role; the roles are {', '.join(ARRAY_ROLES)}, "
                                 f"{SAMPLE_WEIGHT_ROLE}")
            if not name:
                raise ValueError(f"the array name for {role} is empty")
        return value

    @field_validator("features", mode="before")
    @classmethod
    def _check_features(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if value is None:
            return value
        if kind in ("csv", "tfds"):
            if not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
                raise ValueError(f"{kind}: expected a non-empty list of "
                                 f"{'column' if kind == 'csv' else 'feature'} names, e.g. [age, income]")
            dupes = sorted({v for v in value if value.count(v) > 1})
            if dupes:
                raise ValueError(f"the column {dupes[0]!r} is listed twice")
        elif kind == "tfrecord":
            if not (isinstance(value, dict) and value):
                raise ValueError("tfrecord: expected a mapping of feature names to specs, e.g. "
                                 "{image: {encoding: png}, label: {dtype: int64}}")
        return value

    @field_validator("rescale", mode="before")
    @classmethod
    def _check_rescale(cls, value: Any) -> Any:
        if value is None or value == "auto":
            return value
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*/\s*(\d+(?:\.\d*)?)\s*", value)
            if match and float(match.group(2)) > 0:
                value = float(match.group(1)) / float(match.group(2))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
            return float(value)
        raise ValueError("expected auto, null (no rescaling), a number > 0 or a fraction such as '1/255'")

    @field_validator("cache", mode="before")
    @classmethod
    def _check_cache(cls, value: Any) -> Any:
        if value == "memory":
            return True
        if isinstance(value, bool) or (isinstance(value, str) and value.strip()):
            return value
        raise ValueError("expected true (memory), false, or a file path for tf.data's on-disk cache")

    @field_validator("augment", mode="before")
    @classmethod
    def _check_augment(cls, value: Any) -> Any:
        if value is None:
            return value
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of Keras image preprocessing layers, e.g. "
                             "[RandomFlip, {RandomRotation: {factor: 0.05}}]")
        from .keras_specs import check_names  # noqa: PLC0415 (reads Keras's files; imports no Keras)

        check_names(value)
        return value

    @model_validator(mode="after")
    def _check_kind(self) -> "DataConfig":
        kind = self.kind
        if self.augment and kind == "csv":
            raise _kind_error("augment", "data.augment applies image layers, and data.kind csv gives rows of "
                              "features, not images; remove data.augment")
        if self.sample_weight is not None and kind != "csv":  # tfgpu.data.csv / arrays carry Split.w
            where = ("an arrays source names its weights array in data.keys: {sample_weight: NAME}"
                     if kind == "arrays" else
                     "a builder's datasets are (x, y) pairs, so write the weights into a CSV column or an "
                     ".npz array" if kind == "builder" else
                     "convert the data to a CSV with a weight column, or a .npz with a weights array")
            raise _kind_error("sample_weight", f"data.kind {kind} has no per-sample weights; data.sample_weight "
                              "is read by kind csv (a column) and, as data.keys.sample_weight, by kind arrays (a "
                              f"1-D array); {where} (or use train.class_weight to weigh whole classes)")
        allowed = set(_COMMON_DATA_KEYS) | set(DATA_KIND_KEYS[kind])
        # A key of another kind left at its default (as a resolved config.yaml holds them) is harmless.
        fields = type(self).model_fields
        stray = [k for k in fields if k in self.model_fields_set and k not in allowed
                 and getattr(self, k) != fields[k].get_default(call_default_factory=True)]
        if stray:
            owners = [k for k, keys in DATA_KIND_KEYS.items() if stray[0] in keys]
            raise _kind_error(
                stray[0], f"'data.{stray[0]}' is not read by data.kind {kind} (it belongs to {', '.join(owners)}); "
                f"the keys of {kind} are: {', '.join(k for k in type(self).model_fields if k in allowed)}")
        for key, what in DATA_REQUIRED.get(kind, ()):
            if getattr(self, key) in (None, ""):
                raise _kind_error(key, f"data.kind {kind} needs data.{key}: {what}")
        if kind in ("mnist", "keras") and self.name is not None:
            names = KERAS_DATASETS[:1] if kind == "mnist" else KERAS_DATASETS
            if self.name not in names:
                raise _kind_error(
                    "name", f"{self.name!r} is not a dataset of kind {kind} ({', '.join(names)}); for your own "
                    "files set data.kind to arrays, image_folder, csv, tfrecord or builder")
        if kind == "tfds" and self.validation_split is not None:
            raise _kind_error("validation_split", "tfds takes its validation data from data.splits, e.g. "
                              "{train: 'train[:90%]', validation: 'train[90%:]'} (TFDS slicing)")
        for role in self.splits:
            if role not in ("train", "validation", "test"):
                raise _kind_error("splits", f"{role!r} is not a split of tfgpu's; the keys are train, validation "
                                  "and test, each naming a TFDS split")
        if self.splits and "train" not in self.splits:
            raise _kind_error("splits", "data.splits has no train entry; name the TFDS split to train on")
        if self.validation_path is not None and self.validation_split is not None:
            raise _kind_error("validation_split", "validation_path and validation_split are both set; set one: "
                              "a separate validation set, or a fraction of the training samples")
        if kind == "tfrecord":
            if isinstance(self.features, list):
                raise _kind_error("features", "tfrecord: expected a mapping of feature names to specs, e.g. "
                                  "{image: {encoding: png}, label: {dtype: int64}}")
            if self.label not in self.features:
                raise _kind_error("label", f"the label feature {self.label!r} is not in data.features "
                                  f"({', '.join(self.features)}); add its spec, e.g. {self.label}: {{dtype: int64}}")
            if len(self.features) < 2:
                raise _kind_error("features", "data.features holds only the label; add the input feature(s)")
        if kind == "csv" and self.features is not None and self.label in self.features:
            raise _kind_error("features", f"the label column {self.label!r} is also listed as a feature")
        if kind == "csv" and self.sample_weight is not None:
            if self.sample_weight == self.label:
                raise _kind_error("sample_weight", f"the weight column {self.sample_weight!r} is also the label "
                                  "(data.label); name the column that holds each row's weight")
            if self.features is not None and self.sample_weight in self.features:
                raise _kind_error("sample_weight", f"the weight column {self.sample_weight!r} is also listed in "
                                  "data.features; a weight is not an input: remove it from data.features")
        if len(self.delimiter) != 1:
            raise _kind_error("delimiter", f"the delimiter must be one character; received {self.delimiter!r}")
        return self

    def kind_keys(self) -> tuple[str, ...]:
        """The keys this section's kind reads, in schema order (what a resolved config shows)."""
        return tuple(self.keys_for({"kind": self.kind}))

    @classmethod
    def keys_for(cls, raw: Any) -> list[str]:
        """The keys of the kind a raw (unvalidated) data section names; every key when it names none."""
        kind = raw.get("kind") if isinstance(raw, dict) else None
        if not isinstance(kind, str) or kind not in DATA_KIND_KEYS:
            kind = "keras" if isinstance(raw, dict) and raw.get("name") in KERAS_DATASETS[1:] else "mnist"
        allowed = set(_COMMON_DATA_KEYS) | set(DATA_KIND_KEYS[kind])
        return [k for k in cls.model_fields if k in allowed]

    @property
    def dataset_name(self) -> str:
        """The Keras built-in's name (``mnist`` unless ``name`` says otherwise)."""
        return self.name or "mnist"


_Spec = Union[str, dict[str, Any]]


_SPEC_EXAMPLES = {
    "optimizer": ("adam", "{name: adam, learning_rate: 0.001}"),
    "loss": ("sparse_categorical_crossentropy", "{name: sparse_categorical_crossentropy, from_logits: true}"),
    "metric": ("accuracy", "{name: accuracy}"),
}


def _check_spec(value: Any, what: str) -> Any:
    """A Keras object named by string, or a mapping with ``name`` plus arguments."""
    name_example, mapping_example = _SPEC_EXAMPLES[what]
    article = "an" if what[0] in "aeiou" else "a"
    if isinstance(value, str) and value:
        return value
    if isinstance(value, dict):
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{article} {what} given as a mapping needs a 'name' key with a text value, e.g. {mapping_example}"
            )
        return value
    raise ValueError(f"expected {article} {what} name (e.g. {name_example}) or a mapping with 'name' and arguments")


class ApplicationConfig(_Section):
    """A ``keras.applications`` model as the backbone (``model.application``; a bare name: the defaults).

    Attributes:
        name: the application, as ``keras.applications`` spells it (``ResNet50``, ``MobileNetV3Small``).
        weights: ``imagenet`` (Keras's cache ``~/.keras/models``, else its download), ``null`` (random
            initialisation) or the path of a weights file for the application.
        include_top: keep the application's ImageNet classifier (1000 classes); ``false``: the
            ``model.layers`` head (or a Dense layer that fits the data) follows the features.
        pooling: ``avg``, ``max`` or ``null`` (the feature map), as the application's ``pooling`` argument.
        trainable: ``false`` freezes the whole application (as ``model.freeze: [application]``).
        args: further keyword arguments for the application (``alpha``, ``minimalistic``, ...).
    """

    name: str = Field(min_length=1)
    weights: Optional[str] = "imagenet"
    include_top: bool = False
    pooling: Optional[Literal["avg", "max"]] = "avg"
    trainable: bool = True
    args: dict[str, Any] = Field(default_factory=dict)


class RematConfig(_Section):
    """``model.remat``: the training forward pass in checkpointed segments, recomputed in the backward pass
    (:mod:`tfgpu.training.loops.remat`): less activation memory for about one more forward pass of compute.

    Attributes:
        segments: how many segments (at least 2); ``null``: about the square root of the places the model can be
            cut (after each layer of a Sequential model, after each block whose branches have joined).
    """

    segments: Optional[int] = Field(None, ge=2)


class ModelConfig(_Section):
    """The Keras model.

    Attributes:
        layers: Keras layers in order, each ``ClassName: {args}`` (or just
            ``ClassName``) with Keras's own class names, e.g.
            ``- Conv2D: {filters: 16, kernel_size: 3, activation: relu}``.
            The input shape comes from the data.
        builder: instead of ``layers``, ``"package.module:function"`` that
            returns a ``keras.Model``; called with ``input_shape``,
            ``num_classes`` and ``builder_args``.
        builder_args: keyword arguments for ``builder``.
        optimizer: Keras optimizer name (``adam``) or a mapping with ``name``
            and its arguments (``{name: adam, learning_rate: 0.001}``).
        loss: Keras loss name or mapping, as for ``optimizer``.
        metrics: list of Keras metric names or mappings.
        application: a ``keras.applications`` model as the backbone (:class:`ApplicationConfig`, or its
            name); ``layers`` is then the head after it (default: one Dense layer that fits the data).
        init_from: start from an earlier run's weights: a run directory (its ``model.keras``), a
            ``.keras`` file or a ``.weights.h5`` file; layers are matched by name and shape.
        freeze: layer names or name prefixes (or ``application``) made non-trainable before compiling.
        sync_batchnorm: every ``BatchNormalization`` layer computes its batch statistics over the global batch
            (all replicas; Keras's ``synchronized=True``), not its replica's part. On JAX they already are (the step
            is one program over the global batch).
        remat: :class:`RematConfig` (``true``: the default segments): gradient checkpointing on TensorFlow; the
            gradients, dropout masks and moving statistics are those of the plain model.
    """

    layers: Optional[list[Any]] = None
    application: Optional[ApplicationConfig] = None
    init_from: Optional[str] = Field(None, min_length=1)
    freeze: Optional[list[str]] = None
    builder: Optional[ImportPath] = None
    builder_args: dict[str, Any] = Field(default_factory=dict)
    optimizer: Any = "adam"
    loss: Any = "sparse_categorical_crossentropy"
    metrics: list[Any] = Field(default_factory=lambda: ["accuracy"])
    sync_batchnorm: bool = False
    remat: Optional[RematConfig] = None

    @field_validator("remat", mode="before")
    @classmethod
    def _check_remat(cls, value: Any) -> Any:
        mode = value if isinstance(value, str) else value.get("mode") if isinstance(value, dict) else None
        if mode in ("full", "activations", "larger_than", "list_of_layers"):
            raise ValueError(
                f"{mode} is a keras.RematScope mode, which fails in a compiled training step with Keras 3.15.1 "
                "(full, list_of_layers and larger_than) or keeps every layer's input anyway (activations); tfgpu "
                "checkpoints segments of the model instead: use true or {segments: N}")
        return ({} if value else None) if isinstance(value, bool) else value

    @field_validator("layers", mode="before")
    @classmethod
    def _check_layers(cls, value: Any) -> Any:
        if value is None:
            return value
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of layers, e.g. [{Dense: {units: 10}}]")
        for i, layer in enumerate(value):
            if isinstance(layer, str) and layer:
                continue
            if isinstance(layer, dict) and len(layer) == 1:
                (name, args), = layer.items()
                if isinstance(name, str) and (args is None or isinstance(args, dict)):
                    continue
            raise ValueError(
                f"layer {i} ({short_repr(layer)}) is not 'ClassName' or 'ClassName: {{arguments}}' "
                "(one key, its value a mapping of arguments)"
            )
        return value

    @field_validator("application", mode="before")
    @classmethod
    def _application_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("freeze", mode="before")
    @classmethod
    def _check_freeze(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value
        if value is None or (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
            return value
        raise ValueError("expected a list of layer names or name prefixes (or 'application'), e.g. [application]")

    @field_validator("optimizer", mode="before")
    @classmethod
    def _check_optimizer(cls, value: Any) -> Any:
        return _check_spec(value, "optimizer")

    @field_validator("loss", mode="before")
    @classmethod
    def _check_loss(cls, value: Any) -> Any:
        return _check_spec(value, "loss")

    @field_validator("metrics", mode="before")
    @classmethod
    def _check_metrics(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise ValueError("expected a list of metric names, e.g. [accuracy]")
        return [_check_spec(v, "metric") for v in value]

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.application is not None and self.builder is not None:
            raise ValueError("both application and builder are set; a builder makes the whole model, so use "
                             "application with layers (the head) instead")
        if self.layers is not None and self.builder is not None:
            raise ValueError("both layers and builder are set; set one of them")
        return self

    @property
    def defined(self) -> bool:
        """True when the recipe says how to build a model."""
        return self.layers is not None or self.builder is not None or self.application is not None


#: Signals ``train.checkpoint.requeue_signal`` may name (Slurm's ``--signal`` sends one before the time limit).
REQUEUE_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGALRM")


class CheckpointConfig(_Section):
    """Checkpoints, resume and preemption (``train.checkpoint``; ``false`` turns it off).

    Attributes:
        enabled: save checkpoints into ``RUN_DIR/checkpoint/`` so that
            ``tfgpu run --resume RUN_DIR`` (and worker restarts) continue a
            killed run; and stop at SIGTERM with a checkpoint (exit code 75).
            ``fit``: ``keras.Model.save_weights``; ``custom``:
            ``tf.train.Checkpoint.write``; each save under a new name, committed
            in ``summary.json``, then older ones deleted. Off on ``--resume``:
            the checkpoint is still restored. On by default: one save of the MNIST recipe's
            model costs milliseconds (docs/checkpoints.md has the figures).
        every_epochs: save at the end of every N-th epoch (and the last).
        every_steps: also save every N training steps (at the first
            ``steps_per_execution`` call boundary on or after each N); ``null``:
            at epoch ends only.
        requeue_signal: the signal that means "the scheduler will stop this
            job soon" (Slurm: ``#SBATCH --signal=USR1@120``): save at the next
            call boundary, ask Slurm to requeue the job (``scontrol requeue
            $SLURM_JOB_ID``) and exit with 75; ``null``: not handled. SIGTERM
            always saves and exits with 75.
    """

    enabled: bool = True
    every_epochs: int = Field(1, ge=1, le=100_000)
    every_steps: Optional[int] = Field(None, ge=1, le=10**9)
    requeue_signal: Optional[Literal[REQUEUE_SIGNALS]] = "SIGUSR1"


#: Keras callbacks ``train.callbacks`` refuses, and the tfgpu key that does their work (``tfgpu.training.callbacks``).
OWNED_CALLBACKS = {
    "CSVLogger": "tfgpu writes RUN_DIR/metrics.csv itself (keras.callbacks.CSVLogger, one row per epoch)",
    "TensorBoard": "set output.tensorboard: true (TensorBoard logs under RUN_DIR/tensorboard)",
    "BackupAndRestore": "tfgpu checkpoints with train.checkpoint and continues with 'tfgpu run --resume RUN_DIR'",
    "ProgbarLogger": "set train.progress (auto, bar, epoch or none)",
    "History": "tfgpu records every epoch in metrics.csv and summary.json",
    "EarlyStopping": "set train.early_stopping (its keys are EarlyStopping's arguments)",
    "TerminateOnNaN": "set train.terminate_on_nan (true by default)",
}


class EarlyStoppingConfig(_Section):
    """``train.early_stopping``: ``keras.callbacks.EarlyStopping``'s arguments (``true``: its defaults).

    Attributes:
        monitor: the logged figure to watch (``val_loss``; any column of
            ``metrics.csv`` but the timing ones, e.g. ``val_accuracy``).
        mode: ``auto`` (from the metric: accuracy up, loss down), ``min`` or ``max``.
        patience: epochs without improvement before training stops.
        min_delta: the least change that counts as an improvement (absolute).
        restore_best_weights: at the end of training, set the model to the
            best epoch's weights (so ``model.keras`` is the best epoch's model).
        start_from_epoch: epochs to train before watching starts.
        baseline: a value to beat; training stops after ``patience`` epochs
            that do not beat it (``null``: none).
    """

    monitor: str = "val_loss"
    mode: Literal["auto", "min", "max"] = "auto"
    patience: int = Field(0, ge=0, le=100_000)
    min_delta: float = Field(0.0, ge=0)
    restore_best_weights: bool = False
    start_from_epoch: int = Field(0, ge=0, le=100_000)
    baseline: Optional[float] = None


def _check_callbacks(value: Any) -> Any:
    """``train.callbacks``: a list of ``ClassName``, ``{ClassName: {args}}`` or ``module:Class`` (also with args)."""
    if not isinstance(value, list):
        raise ValueError("expected a list of callbacks, e.g. [{ReduceLROnPlateau: {patience: 2}}]")
    for i, item in enumerate(value):
        name, args = (item, None) if isinstance(item, str) else (
            next(iter(item.items())) if isinstance(item, dict) and len(item) == 1 else (None, None))
        if not isinstance(name, str) or not name or not (args is None or isinstance(args, dict)):
            raise ValueError(f"callback {i} ({short_repr(item)}) is not 'ClassName', 'module:Class' or "
                             "'ClassName: {arguments}' (one key, its value a mapping of arguments)")
        if ":" in name:
            _import_path(name)
        elif not re.match(r"^[A-Za-z_]\w*$", name):
            raise ValueError(f"callback {i}: {name!r} is neither a keras.callbacks class name nor 'module:Class'")
        elif name in OWNED_CALLBACKS:
            raise ValueError(f"callback {i}: {name} is tfgpu's own: {OWNED_CALLBACKS[name]}")
    return value


class UnfreezeConfig(_Section):
    """Two-phase fine-tuning (``train.unfreeze``).

    Attributes:
        epoch: the epoch (counted from 0, as ``initial_epoch``) at which the frozen layers
            (``model.freeze``, ``application.trainable: false``) become trainable; epochs before it
            train the rest only.
        learning_rate_factor: the learning rate is multiplied by this for the second phase.
    """

    epoch: int = Field(ge=1, le=100_000)
    learning_rate_factor: float = Field(0.1, gt=0, le=1000)

    @field_validator("learning_rate_factor", mode="before")
    @classmethod
    def _factor_number(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


#: ``train.max_time``'s units: ``3h50m``, ``90m``, ``1d12h``, ``45s`` (:func:`duration_seconds`).
DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def duration_seconds(value: Any) -> float:
    """A duration as seconds: a number (seconds), or ``[Nd][Nh][Nm][Ns]`` such as ``3h50m``, ``90m``, ``1d12h``,
    ``45s``, ``1.5h``; Slurm's ``[D-]HH:MM:SS`` and ``MM:SS`` too (``03:50:00``, ``1-00:00:00``).

    Raises:
        ValueError: anything else, or a duration of 0 or less.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){1,2}", value.strip()):
        days, _, clock = value.strip().rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        while len(parts) < 3:
            parts.insert(0, 0)
        seconds = (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif isinstance(value, str) and value.strip() and (found := _DURATION.match(value.strip().lower())):
        seconds = sum(float(n) * unit for n, unit in zip(found.groups(), DURATION_UNITS.values()) if n)
    else:
        raise ValueError("expected a duration: seconds, or e.g. 3h50m, 90m, 1d12h, 45s, or Slurm's 03:50:00")
    if not seconds > 0:
        raise ValueError("expected a duration above 0, e.g. 3h50m")
    return seconds


class EmaConfig(_Section):
    """``train.ema``: an exponential moving average of the weights (Keras's ``use_ema``), used for validation and
    the saved model (:mod:`tfgpu.training.ema`).

    Attributes:
        momentum: each optimizer step, ``average = momentum x average + (1 - momentum) x weight``
            (Keras ``ema_momentum``); the averages follow about ``1 / (1 - momentum)`` steps.
    """

    momentum: float = Field(0.999, gt=0, lt=1)


class GradientClippingConfig(_Section):
    """``train.gradient_clipping``: one of three ways, applied to the gradient all-reduced over every replica
    (:mod:`tfgpu.training.loops.gradients`), before the optimizer's update.

    Attributes:
        global_norm: scale all gradients together so that their global L2 norm is at most this
            (Keras ``global_clipnorm``; ``tf.clip_by_global_norm``).
        norm: scale each variable's gradient so that its L2 norm is at most this (Keras ``clipnorm``).
        value: clip each gradient element to ``[-value, value]`` (Keras ``clipvalue``).
    """

    global_norm: Optional[float] = Field(None, gt=0)
    norm: Optional[float] = Field(None, gt=0)
    value: Optional[float] = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_way(self) -> "GradientClippingConfig":
        given = [k for k in ("global_norm", "norm", "value") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("expected exactly one of global_norm, norm or value, e.g. {global_norm: 1.0}; "
                             f"received {', '.join(given) or 'none'}")
        return self

    @property
    def keras_argument(self) -> tuple[str, float]:
        """``(name, value)``: the Keras optimizer argument (``global_clipnorm``, ``clipnorm`` or ``clipvalue``)."""
        for key, name in (("global_norm", "global_clipnorm"), ("norm", "clipnorm"), ("value", "clipvalue")):
            if getattr(self, key) is not None:
                return name, float(getattr(self, key))
        raise AssertionError("validated: one is set")


class TrainConfig(_Section):
    """The training loop.

    Attributes:
        loop: ``fit`` (``keras.Model.fit``) or ``custom`` (a ``GradientTape``
            step run with ``strategy.run``).
        epochs: passes over the training set.
        batch_size_per_replica: samples each replica takes per step; the
            global batch is this x the number of replicas. ``auto``: the
            largest that trains without running out of memory, less 10 %,
            found by trials in child processes and cached per model, data,
            precision and devices (:mod:`tfgpu.training.batch_finder`).
        lr_scaling: scale the optimizer's learning rate with the number of
            replicas: ``none``, ``linear`` (x replicas) or ``sqrt``.
        lr_schedule: ``null`` (a constant rate, the default), a name
            (``constant``, ``cosine``, ``exponential``, ``piecewise``, or a
            ``keras.optimizers.schedules`` class) or a mapping ``{name,
            warmup_epochs, warmup_from, decay_epochs, boundaries_epochs,
            factors, ...the Keras class's arguments}``: a linear warmup to the
            scaled rate, then the decay (:mod:`tfgpu.model.schedules`; docs/config.md
            "Learning-rate schedules").
        progress: ``auto`` (a bar on a terminal, a line per epoch otherwise),
            ``bar``, ``epoch`` or ``none``.
        terminate_on_nan: stop when the loss becomes NaN
            (``keras.callbacks.TerminateOnNaN`` for ``fit``).
        steps_per_execution: training steps run in one ``tf.function``
            call (a ``tf.range`` loop of steps: for ``fit``, tfgpu's train
            function over the model's ``train_step``; for ``custom``, its own
            step). A most (``auto``: 32), never more than one epoch: signals,
            saves and progress wait for a call to end. Both loops run that many
            (an epoch's last call the rest); ``custom`` shortens calls that
            take over 5 s. ``fit`` on JAX (Keras's own train function) runs the
            largest divisor of the epoch's step count up to it (178 steps give
            2, a prime 1), as Keras's calls must divide the epoch there, and
            ``fit`` on several workers 1
            (:func:`tfgpu.training.trainer.resolve_steps_per_execution`).
            Progress and batch-level callbacks see one update per call.
        profile_steps: ``[first, last]`` training steps (counted from 1 over
            the whole run) to record with TensorFlow's profiler into the
            TensorBoard logs (``keras.callbacks.TensorBoard(profile_batch=...)``);
            needs ``output.tensorboard: true``. With several steps per call,
            the whole calls holding those steps are profiled.
        checkpoint: :class:`CheckpointConfig` (``true``/``false``: on/off with the defaults).
        class_weight: ``balanced`` (``n_samples / (n_classes * count_c)`` over
            the training labels, scikit-learn's formula) or ``{class: weight}``
            by class name or index (the others 1): each training sample's
            loss is multiplied by its class's weight (:mod:`tfgpu.data.weights`);
            validation and test are not weighted.
        early_stopping: :class:`EarlyStoppingConfig` (``keras.callbacks.EarlyStopping``;
            ``true``: its defaults; ``null``/``false``: off, the default).
        callbacks: Keras callbacks, each ``ClassName`` or ``{ClassName: {args}}``
            from ``keras.callbacks`` (e.g. ``ReduceLROnPlateau``, ``ModelCheckpoint``),
            or ``module:Class`` for one of your own; relative file paths in
            their arguments are inside the run directory (:mod:`tfgpu.training.callbacks`).

        gradient_accumulation_steps: micro-batches per optimizer step (1: none). Each replica takes
            ``K x batch_size_per_replica`` rows a step and runs them as ``K`` micro-batches of
            ``batch_size_per_replica`` one after another, summing their gradients; the sum is all-reduced once and
            applied once (:mod:`tfgpu.training.loops.gradients`). The effective batch is per replica x replicas x K;
            ``steps_per_epoch``, schedules, ``lr_scaling`` and checkpoints count optimizer steps.
        gradient_clipping: :class:`GradientClippingConfig`, applied after the all-reduce; ``null``: none.
        ema: :class:`EmaConfig` (``true``: momentum 0.999): validate, save and serve a moving average of the
            weights; ``null``: none.
        steps_per_epoch: at most this many optimizer steps an epoch (the first of each epoch's shuffle);
            ``null``: the whole training split.
        validation_steps: at most this many validation batches an epoch; ``null``: the whole split.
        test_steps: at most this many batches of the test split when the run ends; ``null``: the whole split.
        max_time: stop cleanly after this long of training (``3h50m``, ``90m``, Slurm's ``03:50:00``): a
            checkpoint is saved at the next call boundary and the run exits 75 (``preempted``), as for a
            scheduler's signal, so ``tfgpu run --resume`` continues it. Counted from this process's start.
    """

    loop: Literal["fit", "custom"] = "fit"
    epochs: int = Field(10, ge=1, le=100_000)
    batch_size_per_replica: Union[Literal["auto"], int] = 32
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    lr_schedule: Optional[dict[str, Any]] = None
    progress: Literal["auto", "bar", "epoch", "none"] = "auto"
    terminate_on_nan: bool = True
    steps_per_execution: Union[Literal["auto"], int] = "auto"
    profile_steps: Optional[list[int]] = None
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    unfreeze: Optional[UnfreezeConfig] = None
    early_stopping: Optional[EarlyStoppingConfig] = None
    callbacks: list[Any] = Field(default_factory=list)
    class_weight: Union[Literal["balanced"], dict[Union[int, str], float], None] = None
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096)
    gradient_clipping: Optional[GradientClippingConfig] = None
    ema: Optional[EmaConfig] = None
    steps_per_epoch: Optional[int] = Field(None, ge=1, le=10**9)
    validation_steps: Optional[int] = Field(None, ge=1, le=10**9)
    test_steps: Optional[int] = Field(None, ge=1, le=10**9)
    max_time: Optional[float] = None

    @field_validator("max_time", mode="before")
    @classmethod
    def _check_max_time(cls, value: Any) -> Any:
        return None if value is None else duration_seconds(value)

    @field_validator("lr_schedule", mode="before")
    @classmethod
    def _check_lr_schedule(cls, value: Any) -> Any:
        from .keras_specs import ScheduleError, normalize  # noqa: PLC0415  (reads Keras's files, imports no Keras)

        try:
            return normalize(value)
        except ScheduleError as exc:
            if exc.key and isinstance(value, dict) and exc.key in value:  # located at the sub-key's line
                raise PydanticCustomError("key_error", "{text}", {"loc": (exc.key,), "text": str(exc)}) from None
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _check_warmup_length(self) -> "TrainConfig":
        from .keras_specs import check_length  # noqa: PLC0415

        try:
            check_length(self.lr_schedule, self.epochs)
        except ValueError as exc:
            raise PydanticCustomError("key_error", "{text}", {"loc": ("lr_schedule", "warmup_epochs"),
                                                             "text": str(exc)}) from None
        return self

    @field_validator("class_weight", mode="before")
    @classmethod
    def _check_class_weight(cls, value: Any) -> Any:
        if value is None or value == "balanced":
            return value
        if isinstance(value, dict) and value and all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < float("inf")
                for w in value.values()):
            return value
        raise ValueError("expected balanced (n_samples / (n_classes x the class's samples)) or a mapping of class "
                         "names or indices to weights >= 0, e.g. {malignant: 2.0} or {0: 2.0, 1: 1.0}")

    @field_validator("early_stopping", "ema", mode="before")
    @classmethod
    def _section_switch(cls, value: Any) -> Any:  # true: the section's defaults; false: off
        return ({} if value else None) if isinstance(value, bool) else value

    @field_validator("callbacks", mode="before")
    @classmethod
    def _check_callbacks(cls, value: Any) -> Any:
        return _check_callbacks(value)

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    @field_validator("profile_steps", mode="before")
    @classmethod
    def _check_profile_steps(cls, value: Any) -> Any:
        if value is None or (isinstance(value, list) and len(value) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value) and value[0] <= value[1]):
            return value
        raise ValueError("expected [first, last] training steps, counted from 1, with first <= last, e.g. [10, 20]")

    @field_validator("batch_size_per_replica", mode="before")
    @classmethod
    def _check_batch_size(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2**24):
            return value
        raise ValueError("expected auto (the largest that fits in memory, found in child processes and cached) or "
                         "a whole number of samples from 1 to 16777216")

    @field_validator("steps_per_execution", mode="before")
    @classmethod
    def _check_steps_per_execution(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000):
            return value
        raise ValueError("expected auto or a whole number of steps from 1 to 1000000")


class MlflowConfig(_Section):
    """``output.mlflow``: track the run in MLflow (:mod:`tfgpu.tracking.mlflow`; ``true``: these defaults).

    Attributes:
        tracking_uri: where: an MLflow tracking server (``http://host:5000``)
            or a local store (``sqlite:///mlflow.db``, ``file:./mlruns``);
            ``null``: ``MLFLOW_TRACKING_URI``, else MLflow's own default
            (``sqlite:///mlflow.db`` in the directory the run starts in).
            A ``USER:PASSWORD@`` in it is taken out as the config is read
            (:func:`tfgpu.utils.urls.credentials`): the value kept, written
            and logged has no userinfo, and the credentials go to MLflow in
            ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``
            (:func:`tfgpu.tracking.mlflow.export_credentials`).
        experiment: the MLflow experiment (created when missing); ``null``:
            ``MLFLOW_EXPERIMENT_NAME``, else ``output.name`` or the recipe's stem.
        run_name: the MLflow run's name; ``null``: the run directory's name.
        required: ``true``: a tracking server that cannot be reached is an
            error before TensorFlow starts (exit 11); ``false``: a warning,
            and the run trains without tracking.
        log_model: also log ``model.keras`` as an artifact.
    """

    tracking_uri: Optional[str] = Field(None, min_length=1)
    experiment: Optional[str] = Field(None, min_length=1, max_length=500)
    run_name: Optional[str] = Field(None, min_length=1, max_length=250)
    required: bool = True
    log_model: bool = False
    #: ``(user, password)`` taken out of ``tracking_uri`` (never dumped, written or logged).
    _credentials: Optional[tuple[Optional[str], Optional[str]]] = PrivateAttr(None)

    @model_validator(mode="after")
    def _credentials_out(self) -> "MlflowConfig":
        from ..utils.urls import credentials  # noqa: PLC0415

        clean, user, password = credentials(self.tracking_uri)
        if clean != self.tracking_uri:
            self.__dict__["tracking_uri"] = clean  # (no validate_assignment: set as the field's value)
            self._credentials = (user, password)
        return self


class OutputConfig(_Section):
    """Where runs are written.

    Attributes:
        dir: parent directory of run directories (relative to the current
            directory).
        name: run name prefix; ``null``: the recipe file's stem (or ``run``).
        save_model: save the trained model as ``model.keras``.
        tensorboard: write TensorBoard logs (loss and metrics per epoch,
            training and validation) under ``<run>/tensorboard/``
            (``keras.callbacks.TensorBoard``), with both loops.
        mlflow: :class:`MlflowConfig`: log the run's settings, per-epoch
            metrics, tags and files to MLflow (``true``: its defaults;
            ``false``/``null``: off, the default).
    """

    dir: str = "runs"
    name: Optional[str] = None
    save_model: bool = True
    tensorboard: bool = False
    mlflow: Optional[MlflowConfig] = None

    @field_validator("mlflow", mode="before")
    @classmethod
    def _mlflow_switch(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {} if value else None
        if value is None or isinstance(value, (dict, MlflowConfig)):
            return value
        raise ValueError("expected true, false or a mapping of tracking_uri, experiment, run_name, required, "
                         "log_model, e.g. {tracking_uri: 'http://127.0.0.1:5000', experiment: mnist}")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(r"^[\w.-]+$", value):
            raise ValueError(f"{value!r} may only hold letters, digits, '_', '-' and '.'")
        return value


#: ``backend`` values: the Keras backend a run trains on.
BACKENDS = ("tensorflow", "jax")

#: Settings that have no counterpart on the JAX backend: (section, key, refused when, why and the nearest JAX tool).
#: ``docs/jax.md`` lists the same.
_JAX_REFUSED: tuple[tuple[str, str, Any, str], ...] = (
    ("devices", "gpu_logical_devices", lambda v: v > 1,
     "JAX has one device per GPU and cannot split a GPU into logical devices; the nearest JAX tool is one process "
     "per share of the GPU, each capped with devices.memory_fraction (XLA_CLIENT_MEM_FRACTION)"),
    ("devices", "soft_placement", lambda v: v is False,
     "JAX places each computation where its inputs are (jax.device_put, shardings) and has no strict placement "
     "that false could ask for; remove the key (true, the default, asks for nothing on JAX)"),
    ("devices", "log_device_placement", lambda v: v,
     "JAX does not log per-op placement; the nearest JAX tools are jax.debug.visualize_array_sharding(x) and "
     "JAX_LOG_COMPILES=1 (each compiled function and its devices)"),
    ("tensorflow", "intra_op_threads", lambda v: v != 0,
     "JAX has no per-op thread count; the nearest tools are XLA's CPU flag --xla_cpu_multi_thread_eigen=false "
     "(one thread per op) in XLA_FLAGS, or limiting the process's cores (taskset)"),
    ("tensorflow", "inter_op_threads", lambda v: v != 0,
     "JAX runs one XLA program at a time per device and has no inter-op thread pool to size; remove the key"),
    ("tensorflow", "onednn_opts", lambda v: v is not None,
     "oneDNN's fused kernels are TensorFlow's (TF_ENABLE_ONEDNN_OPTS); XLA:CPU compiles its own; remove the key"),
    ("train", "loop", lambda v: v == "custom",
     "the custom loop is a TensorFlow GradientTape step run with strategy.run; on JAX use loop: fit (Keras's JAX "
     "trainer, one jitted step), or write a step with jax.value_and_grad over model.stateless_call in your own script"),
    ("train", "profile_steps", lambda v: v is not None,
     "tfgpu profiles through TensorFlow's profiler; on JAX the nearest tool is jax.profiler.trace(log_dir) around "
     "the steps, in your own script (tfgpu launch)"),
    ("distribute", "strategy", lambda v: v in ("multi_worker_mirrored", "one_device"),
     "on JAX tfgpu trains data parallel on one machine (keras.distribution.DataParallel); for several machines the "
     "nearest JAX tool is jax.distributed.initialize() with keras.distribution.initialize(), which tfgpu does not "
     "run; for one device set strategy: default (JAX's default device) or devices.visible_gpus"),
    ("distribute", "cross_device_ops", lambda v: v != "auto",
     "on JAX, XLA chooses how replicas sum gradients (all-reduce inside the compiled step); remove the key"),
    ("distribute", "communication", lambda v: v != "auto",
     "MultiWorkerMirroredStrategy's collectives are TensorFlow's; on JAX XLA chooses them; remove the key"),
    ("distribute", "cluster", lambda v: v is not None,
     "multi-worker training is TensorFlow's MultiWorkerMirroredStrategy; on JAX the nearest tool is "
     "jax.distributed.initialize(), which tfgpu does not run; remove the key"),
)


#: ``sweep.parameters`` kinds: the Optuna distribution each becomes (``tfgpu.sweep.distribution``).
PARAMETER_KINDS = ("uniform", "log_uniform", "int", "log_int", "choice")
#: ``sweep.sampler`` names: ``optuna.samplers`` classes.
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "grid": "GridSampler"}
#: ``sweep.pruner`` names: ``optuna.pruners`` classes.
PRUNERS = {"none": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
           "successive_halving": "SuccessiveHalvingPruner", "hyperband": "HyperbandPruner"}


#: The keys a sweep's slot sets for its trials (:mod:`tfgpu.experiments.placement`); a parameter may not search them.
SLOT_KEYS = ("devices.visible_gpus", "devices.memory_fraction", "devices.memory_limit_mib",
             "tensorflow.intra_op_threads", "tensorflow.inter_op_threads")


def _named_spec(value: Any, names: Any, what: str) -> Any:
    """``name`` or ``{name: {arguments}}`` with ``name`` among ``names`` (``sweep.sampler``, ``sweep.pruner``)."""
    name, args = (value, {}) if isinstance(value, str) else (
        next(iter(value.items())) if isinstance(value, dict) and len(value) == 1 else (None, None))
    if not isinstance(name, str) or not isinstance(args, (dict, type(None))):
        raise ValueError(f"expected a {what} name or '{{name: {{arguments}}}}' (one key, its value a mapping)")
    if name not in names:
        raise ValueError(f"unknown {what} {name!r}; expected one of: {', '.join(names)}")
    return value


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _check_parameters(value: Any) -> Any:
    """``sweep.parameters``: ``{dotted.key: {kind: arguments}}`` (:data:`PARAMETER_KINDS`)."""
    if not isinstance(value, dict) or not value:
        raise ValueError("expected a mapping of dotted config keys to one search space each, e.g. "
                         "{model.optimizer.learning_rate: {log_uniform: [1.0e-4, 1.0e-2]}}")
    for key, spec in value.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$", key):
            raise ValueError(f"{short_repr(key)} is not a dotted config key such as train.batch_size_per_replica")
        if key in SLOT_KEYS:
            raise ValueError(f"{key}: each trial's slot sets it (its devices and threads: docs/sweep.md), so a "
                             "sweep cannot search it; set per_trial or --parallel instead")
        if key.split(".")[0] in ("sweep", "output"):
            raise ValueError(f"{key}: the sweep sets no {key.split('.')[0]}.* key for its trials "
                             "(each trial's run directory and tracking are the sweep's)")
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in PARAMETER_KINDS:
            raise ValueError(f"{key}: expected one of {', '.join(k + ': ...' for k in PARAMETER_KINDS)} "
                             f"(received {short_repr(spec)})")
        kind, args = next(iter(spec.items()))
        if kind == "choice":
            if not isinstance(args, list) or not args or not all(_is_scalar(a) for a in args):
                raise ValueError(f"{key}: choice takes a non-empty list of numbers, text, true/false or null "
                                 f"(received {short_repr(args)})")
            if len({repr(a) for a in args}) != len(args):
                raise ValueError(f"{key}: choice lists a value twice (received {short_repr(args)})")
            continue
        whole = kind in ("int", "log_int")
        number = (int,) if whole else (int, float)
        if (not isinstance(args, list) or len(args) != 2
                or not all(isinstance(a, number) and not isinstance(a, bool) for a in args)):
            raise ValueError(f"{key}: {kind} takes [low, high], two {'integers' if whole else 'numbers'} "
                             f"(received {short_repr(args)})")
        low, high = args
        if not low < high:
            raise ValueError(f"{key}: {kind} needs low < high (received {short_repr(args)})")
        if kind.startswith("log") and low <= 0:
            raise ValueError(f"{key}: {kind} needs low > 0, a logarithmic range cannot reach 0 "
                             f"(received {short_repr(args)})")
    return value


class PerTrialConfig(_Section):
    """``sweep.per_trial``: the devices each trial gets (:mod:`tfgpu.experiments.placement`).

    Attributes:
        gpus: GPUs per trial: a whole number (each trial sees that many GPUs
            through ``CUDA_VISIBLE_DEVICES``), or a fraction below 1 (``0.5``:
            two trials share each GPU, each capped with
            ``devices.memory_fraction: 0.5``). Ignored on a host without GPUs,
            where ``--parallel K`` slots share the CPU cores.
    """

    gpus: Union[int, float] = Field(1, gt=0, le=64)


class SweepConfig(_Section):
    """``sweep``: a hyperparameter search over the recipe, run by ``tfgpu sweep`` (Optuna; docs/sweep.md).

    ``tfgpu run`` ignores this section; each trial is an ordinary ``tfgpu run`` of the recipe with the
    trial's parameters set like ``--set``.

    Attributes:
        metric: the figure each trial is judged by: any column of the run's
            ``metrics.csv`` (``val_accuracy``, ``val_loss``, ...) or a
            ``test_*`` figure; the trial's value is its last epoch's.
        direction: ``maximize`` or ``minimize``; ``null``: from the metric's
            name (loss, error and the like down, the rest up).
        trials: how many trials the study runs in all (``--trials`` overrides).
        sampler: ``tpe`` (``optuna.samplers.TPESampler``, the default), ``random``
            or ``grid`` (every parameter a ``choice``); or ``{name: {arguments}}``.
        pruner: ``median`` (``optuna.pruners.MedianPruner``, the default),
            ``none``, ``percentile``, ``successive_halving`` or ``hyperband``;
            or ``{name: {arguments}}``. Trials report ``metric`` after each epoch.
        parameters: ``{dotted.key: {kind: arguments}}``, kind one of
            ``uniform: [low, high]``, ``log_uniform: [low, high]``,
            ``int: [low, high]``, ``log_int: [low, high]``, ``choice: [a, b, ...]``.
        enqueue: parameter sets to try first, in order (``optuna.Study.enqueue_trial``).
        per_trial: :class:`PerTrialConfig`.
        seed: the sampler's seed (``null``: unseeded).
    """

    metric: str = "val_loss"
    direction: Optional[Literal["maximize", "minimize"]] = None
    trials: int = Field(8, ge=1, le=100_000)
    sampler: Annotated[Any, AfterValidator(lambda v: _named_spec(v, SAMPLERS, "sampler"))] = "tpe"
    pruner: Annotated[Any, AfterValidator(lambda v: _named_spec(v, PRUNERS, "pruner"))] = "median"
    parameters: Annotated[dict[str, Any], AfterValidator(_check_parameters)]
    enqueue: list[dict[str, Any]] = Field(default_factory=list)
    per_trial: PerTrialConfig = Field(default_factory=PerTrialConfig)
    seed: Optional[int] = None

    @model_validator(mode="after")
    def _check_enqueued(self) -> "SweepConfig":
        for i, params in enumerate(self.enqueue):
            unknown = sorted(set(params) - set(self.parameters))
            if unknown:
                raise PydanticCustomError(
                    "key_error", "enqueued trial {i} sets {unknown}, which sweep.parameters does not search",
                    {"loc": ("enqueue", i), "i": i, "unknown": ", ".join(unknown)})
            missing = sorted(set(self.parameters) - set(params))
            if missing and self.sampler_name == "grid":
                raise PydanticCustomError(
                    "key_error", "enqueued trial {i} leaves out {missing}; with sampler: grid each enqueued trial "
                    "is one point of the grid and names every parameter",
                    {"loc": ("enqueue", i), "i": i, "missing": ", ".join(missing)})
            for key, value in params.items():
                kind, args = next(iter(self.parameters[key].items()))
                if kind == "choice":
                    fits = any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in args)
                else:
                    number = isinstance(value, (int, float)) and not isinstance(value, bool)
                    fits = number and args[0] <= value <= args[1] and (kind not in ("int", "log_int")
                                                                       or isinstance(value, int))
                if not fits:
                    raise PydanticCustomError(
                        "key_error", "enqueued trial {i} sets {key} to {value}, outside its search space {kind} "
                        "{args}", {"loc": ("enqueue", i), "i": i, "key": key, "value": short_repr(value),
                                   "kind": kind, "args": short_repr(args)})
        if self.per_trial.gpus > 1 and self.per_trial.gpus != int(self.per_trial.gpus):
            raise PydanticCustomError(
                "key_error", "per_trial.gpus above 1 must be a whole number of GPUs (a fraction shares one GPU)",
                {"loc": ("per_trial", "gpus")})
        return self

    @property
    def sampler_name(self) -> str:
        """``tpe``, ``random`` or ``grid``."""
        return self.sampler if isinstance(self.sampler, str) else next(iter(self.sampler))

    @property
    def pruner_name(self) -> str:
        """One of :data:`PRUNERS`."""
        return self.pruner if isinstance(self.pruner, str) else next(iter(self.pruner))


class Config(_Section):
    """A whole tfgpu configuration (the schema of a recipe).

    Attributes:
        backend: the Keras backend: ``tensorflow`` (default) or ``jax``.
            Becomes ``KERAS_BACKEND`` before Keras is imported; on ``jax``
            the device settings become JAX's environment variables
            (``docs/jax.md`` maps each one) and settings with no JAX
            counterpart are refused.
    """

    backend: Literal[BACKENDS] = "tensorflow"
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    tensorflow: TensorflowConfig = Field(default_factory=TensorflowConfig)
    distribute: DistributeConfig = Field(default_factory=DistributeConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    sweep: Optional[SweepConfig] = None

    @model_validator(mode="after")
    def _check_across_sections(self) -> "Config":
        if self.train.profile_steps is not None and not self.output.tensorboard:
            raise PydanticCustomError(
                "key_error", "profiling writes into the TensorBoard logs, which are off; set output.tensorboard: "
                "true as well, or remove train.profile_steps", {"loc": ("train", "profile_steps")})
        if self.backend == "jax":
            self._check_jax()
            if self.data.augment and self.data.augment_on == "pipeline":
                raise PydanticCustomError(
                    "key_error", "data.augment runs in the tf.data pipeline, and with backend: jax tfgpu feeds "
                    "NumPy batches (keras.utils.PyDataset, no tf.data); set data.augment_on: model (the layers "
                    "then run in the model, on JAX, in training only)", {"loc": ("data", "augment_on")})
            if self.train.class_weight is not None:
                raise PydanticCustomError(
                    "key_error", "train.class_weight puts per-sample weights into the tf.data training pipeline, "
                    "which backend: jax does not use (tfgpu feeds it NumPy batches); use backend: tensorflow",
                    {"loc": ("train", "class_weight")})
            if self.data.sample_weight is not None or SAMPLE_WEIGHT_ROLE in self.data.keys:
                key = "sample_weight" if self.data.sample_weight is not None else "keys"
                raise PydanticCustomError(
                    "key_error", f"data.{'sample_weight' if key == 'sample_weight' else 'keys.sample_weight'} puts "
                    "per-sample weights into the tf.data training pipeline, which backend: jax does not use (tfgpu "
                    "feeds it NumPy batches); use backend: tensorflow", {"loc": ("data", key)})
        return self

    def _check_jax(self) -> None:
        """Refuse the settings that have no JAX counterpart (:data:`_JAX_REFUSED`), naming the nearest JAX tool."""
        found = [(section, key, why) for section, key, refused, why in _JAX_REFUSED
                 if key in getattr(self, section).model_fields_set and refused(getattr(getattr(self, section), key))]
        if found:
            section, key, why = found[0]
            others = ", ".join(f"{s}.{k}" for s, k, _ in found[1:])
            raise PydanticCustomError(
                "key_error", "no JAX counterpart (backend: jax): " + why
                + (f" (also without a JAX counterpart here: {others}; docs/jax.md lists each)" if others else ""),
                {"loc": (section, key)})

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration as plain data (what a run saves).

        The data section holds the keys its kind reads (the others do nothing).
        """
        data = self.model_dump(mode="python")
        data["data"] = {k: data["data"][k] for k in self.data.kind_keys()}
        return data

    def explicit_dict(self) -> dict[str, Any]:
        """Only the keys that were given (file, dict, overrides), not the defaults.

        Loading it again gives an equal config that also knows which keys were
        set; planning depends on that (e.g. an explicit ``tensorflow.log_level``
        replaces an existing ``TF_CPP_MIN_LOG_LEVEL``, a default one does not).
        """
        return self.model_dump(mode="python", exclude_unset=True)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


def run_name(cfg: Config, recipe: Optional[str]) -> str:
    """The name a new run directory starts with: ``output.name``, else the recipe's file name, else ``run``."""
    return cfg.output.name or (Path(recipe).stem if recipe else "run")
