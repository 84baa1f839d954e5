"""``kind: image_folder``: one sub-folder of images per class, as ``keras.utils.image_dataset_from_directory`` reads it.

Class names are the sub-folders' names, sorted (folders starting with ``.``
are skipped); each class's images are found by walking its folder, with the
extensions Keras reads (``.bmp``, ``.gif``, ``.jpeg``, ``.jpg``, ``.png``),
sorted. ``validation_path`` and ``test_path`` are folders of the same shape:
their class folders must be among the training classes.

:meth:`ImageFolderSource.check` opens every image with Pillow before
TensorFlow starts (header and integrity, ``PIL.Image.verify``; about 20 us an
image): a file that is not an image or is damaged, a class folder without
images, a single class, and images whose sizes or channels differ while
``image_size``/``color_mode`` do not say how to make them equal are data
errors then. TensorFlow decodes them (``tf.io.decode_image``, then
``tf.image.resize`` where ``image_size`` differs from an image's size), as
Keras's loader does; images are kept as uint8 ``(H, W, C)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..config import DataConfig
from ..errors import DataError
from ..utils.lazy import numpy as np
from .base import Data, DataSpec, LoadContext, Reader, Source, Split, existing, holdout, rescale_for, tf_error_text

EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
CHANNELS = {"grayscale": 1, "rgb": 3, "rgba": 4}
_MODE_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "I;16L": 1, "F": 1, "LA": 2, "La": 2,
                  "RGB": 3, "YCbCr": 3, "RGBA": 4, "RGBa": 4}
_IGNORED = {"thumbs.db", "desktop.ini"}  # files operating systems leave in image folders


@dataclass(frozen=True)
class Listing:
    """The images of one folder: paths, labels and what Pillow read of them.

    Attributes:
        root: the folder.
        paths: every image, by class then path.
        labels: each image's class number (int32).
        sizes: each image's ``(height, width)``.
        channels: each image's channels as TensorFlow decodes it (1, 2, 3 or 4).
        per_class: images in each class folder.
    """

    root: Path
    paths: tuple[str, ...]
    labels: np.ndarray
    sizes: tuple[tuple[int, int], ...]
    channels: tuple[int, ...]
    per_class: dict[str, int]


def class_folders(root: Path) -> list[str]:
    """The class folders' names, sorted, without hidden ones (Keras's order)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _inspect(path: str) -> tuple[Optional[tuple[int, int]], int, Optional[str]]:
    """``((height, width), channels, None)`` for a readable image, else ``(None, 0, why)``."""
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415

    try:
        with Image.open(path) as image:
            width, height = image.size
            mode, fmt, info = image.mode, image.format, image.info
            image.verify()
    except UnidentifiedImageError:
        return None, 0, "not an image Pillow can read"
    except Exception as exc:  # Pillow raises many kinds for damaged files
        return None, 0, f"damaged ({type(exc).__name__}: {str(exc).strip() or 'no detail'})"
    if fmt == "GIF":
        channels = 3  # tf.io.decode_gif always gives RGB
    elif mode == "P":  # palette images decode to RGB, or RGBA with a transparent colour
        channels = 4 if "transparency" in info else 3
    elif mode in _MODE_CHANNELS:
        channels = _MODE_CHANNELS[mode]
    else:
        return None, 0, f"its colour mode {mode} (e.g. CMYK) is not one TensorFlow decodes"
    if fmt not in ("PNG", "JPEG", "BMP", "GIF", "MPO"):
        return None, 0, f"a {fmt} file, not a PNG, JPEG, BMP or GIF as its extension says"
    return (height, width), channels, None


def list_images(root: Path, key: str, classes: Optional[list[str]] = None) -> Listing:
    """List and inspect a class-folder tree (no TensorFlow).

    Args:
        root: the folder holding one sub-folder per class.
        key: ``path``, ``validation_path`` or ``test_path`` (for messages).
        classes: the training classes; ``None`` for the training folder itself.

    Raises:
        DataError: no class folders, a single class (training), a class folder
            unknown to training, a class without images, or a file that is not
            a readable image.
    """
    if not root.is_dir():
        raise DataError(f"data.{key}: '{root}' is a file; expected a folder with one sub-folder of images per class.",
                        "point it at the folder that holds the class folders.")
    names = class_folders(root)
    if not names:
        loose = [p.name for p in root.iterdir() if p.suffix.lower() in EXTENSIONS][:3]
        hint = f" (it holds images such as {', '.join(loose)} directly)" if loose else ""
        raise DataError(
            f"data.{key}: '{root}' has no class sub-folders{hint}; image_folder reads one sub-folder per class, "
            "named after the class.",
            "move the images into one folder per class, e.g. photos/train/cat/1.jpg and photos/train/dog/2.jpg.",
        )
    if classes is None and len(names) < 2:
        raise DataError(
            f"data.{key}: '{root}' has one class folder ({names[0]}); a classifier needs at least two classes.",
            "add a sub-folder of images for each other class.",
        )
    if classes is not None:
        unknown = [n for n in names if n not in classes]
        if unknown:
            raise DataError(
                f"data.{key}: '{root}' has class folder(s) {', '.join(unknown)} that the training folder "
                f"does not have (training classes: {', '.join(classes)}).",
                "use the same class folder names as the training data, or remove those folders.",
            )
    index = {n: i for i, n in enumerate(classes if classes is not None else names)}
    paths: list[str] = []
    labels: list[int] = []
    per_class: dict[str, int] = {}
    strays: list[str] = []
    for name in names:
        found = 0
        for dirpath, files in walk_sorted(root / name):
            for fname in files:
                if fname.lower().endswith(EXTENSIONS):
                    paths.append(os.path.join(dirpath, fname))
                    labels.append(index[name])
                    found += 1
                else:
                    strays.append(os.path.join(dirpath, fname))
        per_class[name] = found
    if strays:
        raise DataError(
            f"data.{key}: {len(strays)} file(s) in the class folders are not images by their extension "
            f"(png, jpeg, jpg, bmp, gif), e.g. {strays[0]}.",
            "move the files that are not images out of the class folders.",
        )
    empty = [n for n, count in per_class.items() if count == 0]
    if empty:
        raise DataError(
            f"data.{key}: the class folder(s) {', '.join(empty)} in '{root}' hold no images "
            "(png, jpeg, jpg, bmp, gif).",
            "add images to each class folder, or remove the empty ones.",
        )
    # One after another: 0.50 s for 22,699 MNIST PNGs, against 1.3-1.5 s in a pool of 4 threads (the GIL).
    inspected = [_inspect(p) for p in paths]
    bad = [(p, why) for p, (_, _, why) in zip(paths, inspected) if why]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise DataError(f"data.{key}: {bad[0][0]} is {bad[0][1]}{more}.",
                        "replace or remove the file(s); every file in a class folder must be an image.")
    return Listing(root, tuple(paths), np.asarray(labels, dtype=np.int32),
                   tuple(s for s, _, _ in inspected), tuple(c for _, c, _ in inspected), per_class)


def _uniform(listings: list[Listing], cfg: DataConfig) -> tuple[tuple[int, int], int, bool]:
    """``(image_size, channels, resize_needed)`` for all the listings, from the config or the images.

    Raises:
        DataError: sizes (or channels) differ and ``image_size`` (``color_mode``) is not set.
    """
    def example(values: tuple, wanted: Any) -> str:
        for listing in listings:
            for path, value in zip(listing.paths, values(listing)):
                if value == wanted:
                    return path
        return "?"

    sizes = {s for listing in listings for s in listing.sizes}
    if cfg.image_size is not None:
        size = (cfg.image_size[0], cfg.image_size[1])
    elif len(sizes) > 1:
        a, b = sorted(sizes)[:2]
        raise DataError(
            f"data.path: the images differ in size, e.g. {a[0]}x{a[1]} ({example(lambda l: l.sizes, a)}) and "
            f"{b[0]}x{b[1]} ({example(lambda l: l.sizes, b)}); {len(sizes)} sizes in all.",
            "set data.image_size: [height, width] to resize them all to one size.",
        )
    else:
        size = sizes.pop()
    found = {c for listing in listings for c in listing.channels}
    if cfg.color_mode is not None:
        channels = CHANNELS[cfg.color_mode]
    elif len(found) > 1:
        a, b = sorted(found)[:2]
        raise DataError(
            f"data.path: the images have mixed channels, e.g. {a} ({example(lambda l: l.channels, a)}) and "
            f"{b} ({example(lambda l: l.channels, b)}).",
            "set data.color_mode (grayscale, rgb or rgba) to convert them all to one.",
        )
    else:
        channels = found.pop()
        if channels == 2:
            raise DataError(
                f"data.path: the images are grey with alpha (2 channels), e.g. {listings[0].paths[0]}.",
                "set data.color_mode: grayscale or rgba.",
            )
    resize = any(s != size for listing in listings for s in listing.sizes)
    return size, channels, resize


def walk_sorted(root: Path | str) -> list[tuple[str, list[str]]]:
    """``(folder, file names)`` for ``root`` and every folder below it, folders in sorted path order and
    names sorted; hidden folders (``.git``, ``.ipynb_checkpoints``) are not entered, and hidden files and
    the files operating systems leave (``Thumbs.db``, ``desktop.ini``) are left out.

    The walk is pruned as it goes (``os.walk`` top-down), then sorted: sorting ``os.walk`` itself would
    read the whole tree first, hidden folders included. Symbolic links to folders are followed, at every depth
    (training and ``tfgpu predict`` read the same files from a tree built of links), each real folder once: a
    link back up the tree is not entered again."""
    found = []
    seen = {os.path.realpath(root)}
    for dirpath, dirnames, files in os.walk(root, followlinks=True):
        kept = []
        for d in sorted(dirnames):  # of two links to one folder, the first by name is kept, whatever the disk's order
            real = os.path.realpath(os.path.join(dirpath, d))
            if not d.startswith(".") and real not in seen:
                seen.add(real)
                kept.append(d)
        dirnames[:] = kept
        found.append((dirpath, sorted(f for f in files if not f.startswith(".") and f.lower() not in _IGNORED)))
    return sorted(found, key=lambda w: w[0])


def decode_image(path: Any, size: tuple[int, int], channels: int, resize: Optional[bool], interpolation: str) -> Any:
    """Read and decode one image file as training does: uint8 ``(height, width, channels)``.

    ``tf.io.decode_image(channels=channels)`` (which converts other channel
    counts where the format allows, e.g. RGB to grey), then, where ``resize``,
    ``tf.image.resize(size, method=interpolation)`` rounded and clipped back to
    uint8. Usable inside ``tf.data.Dataset.map``.

    Args:
        path: the file's path (a string tensor).
        size: ``(height, width)`` of the result, in pixels.
        channels: 1, 3 or 4.
        resize: ``True``: resize every image (training resizes all when any differs);
            ``False``: none (they all have ``size``); ``None``: only an image whose size differs.
        interpolation: the ``tf.image.resize`` method (``data.interpolation``).

    Returns:
        A uint8 tensor of shape ``(*size, channels)``.

    Wraps: https://www.tensorflow.org/api_docs/python/tf/io/decode_image and
    https://www.tensorflow.org/api_docs/python/tf/image/resize
    """
    import tensorflow as tf  # noqa: PLC0415

    image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)

    def resized() -> Any:
        out = tf.image.resize(image, size, method=interpolation)
        return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)

    if resize:
        image = resized()
    elif resize is None:
        same = tf.reduce_all(tf.equal(tf.shape(image)[:2], tf.constant(size, dtype=tf.int32)))
        image = tf.cond(same, lambda: image, resized)
    image.set_shape((*size, channels))
    return image


class ImageReader(Reader):
    """Streams ``(uint8 image (H, W, C), int32 label)`` from image files (``tf.io.decode_image``)."""

    shuffles = True  # the path list is shuffled, whole, before decoding

    def __init__(self, paths: tuple[str, ...], labels: np.ndarray, size: tuple[int, int], channels: int,
                 resize: bool, interpolation: str) -> None:
        self.paths, self.labels = paths, labels
        self.size, self.files = len(paths), paths
        self.image_size, self.channels, self.resize, self.interpolation = size, channels, resize, interpolation

    def decode(self, path: Any) -> Any:
        return decode_image(path, self.image_size, self.channels, self.resize, self.interpolation)

    def dataset(self, shuffle: bool, seed: Optional[int], shard: Optional[tuple[int, int]] = None) -> Any:
        import tensorflow as tf  # noqa: PLC0415

        ds = tf.data.Dataset.from_tensor_slices((list(self.paths), self.labels))
        if shard is not None:
            ds = ds.shard(*shard)
        if shuffle:
            ds = ds.shuffle(len(self.paths), seed=seed, reshuffle_each_iteration=True)
        return ds.map(lambda p, y: (self.decode(p), y), num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=not shuffle)

    def locate_error(self, error: BaseException) -> Optional[str]:
        import tensorflow as tf  # noqa: PLC0415

        for path in self.paths:
            try:
                self.decode(tf.constant(path))
            except Exception as exc:  # the first file TensorFlow cannot decode
                return f"{path}: {tf_error_text(exc)}"
        return None


class ImageFolderSource(Source):
    """``kind: image_folder`` (see the module doc)."""

    kind = "image_folder"

    def check(self, keep: bool = True) -> None:
        cfg: DataConfig = self.cfg
        fix = "point it at the folder that holds one sub-folder of images per class."
        self.train = list_images(existing(cfg.path, "path", "a folder of class folders", f"check data.path; {fix}"),
                                 "path")
        self.classes = list(self.train.per_class)
        self.others: dict[str, Listing] = {}
        for key, name in (("validation_path", "validation"), ("test_path", "test")):
            value = getattr(cfg, key)
            if value is not None:
                folder = existing(value, key, "a folder of class folders", f"check data.{key}; {fix}")
                self.others[name] = list_images(folder, key, self.classes)
        self.image_size, self.channels, self.resize = _uniform([self.train, *self.others.values()], cfg)

    def load(self, context: LoadContext) -> Data:
        cfg: DataConfig = self.cfg

        def split(name: str, origin: str, paths: tuple[str, ...], labels: np.ndarray) -> Split:
            reader = ImageReader(paths, labels, self.image_size, self.channels, self.resize, cfg.interpolation)
            return Split(name, origin, reader=reader, size=len(paths))

        paths, labels = self.train.paths, self.train.labels
        validation = None
        if cfg.validation_split is not None:
            keep, held = holdout(len(paths), cfg.validation_split, self.split_seed, str(self.train.root))
            validation = split("validation", f"validation_split {cfg.validation_split} of {self.train.root} "
                               f"(seed {self.split_seed})", tuple(paths[i] for i in held), labels[held])
            paths, labels = tuple(paths[i] for i in keep), labels[keep]
        elif "validation" in self.others:
            other = self.others["validation"]
            validation = split("validation", str(other.root), other.paths, other.labels)
        test = None
        if "test" in self.others:
            other = self.others["test"]
            test = split("test", str(other.root), other.paths, other.labels)
        is_test = validation is None and test is not None
        if is_test:
            validation, test = split("validation", f"{test.origin} (the test split)", test.reader.paths,
                                     test.reader.labels), None
        train = split("train", str(self.train.root), paths, labels)
        details = {"images_per_class": self.train.per_class, "resized": self.resize,
                   "interpolation": cfg.interpolation if self.resize else None}
        spec = DataSpec(kind="image_folder", source=f"image folder {self.train.root}",
                        sample_shape=(*self.image_size, self.channels), x_dtype="uint8",
                        rescale=rescale_for(cfg, "uint8"), task="classification", num_classes=len(self.classes),
                        class_names=tuple(self.classes), label_dtype="int32", details=details)
        return Data(train, validation, test, spec, validation_is_test=is_test)
