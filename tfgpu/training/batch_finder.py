"""``train.batch_size_per_replica: auto`` and ``tfgpu find-batch-size``: the largest per-replica batch that
trains without running out of memory, found in child processes and cached.

Each size is tried in a fresh process (``python -m tfgpu.training.batch_trial``): the recipe's own run, cut to 2
training steps, 1 validation and 1 test batch, nothing saved. A process, because TensorFlow does not give GPU
memory back to the system once it has taken it, nor after an out-of-memory error (tensorflow/tensorflow#36465),
so a second try in the same process would not measure the same device. A trial is out of memory when training
raised TensorFlow's ``ResourceExhaustedError`` (XLA's ``RESOURCE_EXHAUSTED`` too), an error naming cuDNN's or
CUDA's failed allocation, or when the kernel killed the process (SIGKILL: the OOM killer, for host memory).

The search doubles from ``start`` until a size fails or reaches ``most`` (default: the training split over the
replicas, the largest batch that means anything), then bisects between the largest size that trained and the
smallest that failed until they are 1 apart. The answer is the largest that trained less ``margin`` (10 %: the
allocator's fragmentation, a longer sequence, another process on the GPU), unless no size failed (then the largest
tried, as it is). It is cached in ``$XDG_CACHE_HOME/tfgpu/batch_sizes.json`` under a key of the model, the data, the
precision, XLA, the loop, gradient accumulation and the devices (GPU names and memory settings), so the next
run of the same recipe on the same machine does not search again.

Test seam: ``TFGPU_FAKE_OOM_ABOVE=N`` makes a trial's first training step above ``N`` per replica raise
TensorFlow's ``ResourceExhaustedError``, as a real one would (a GPU cannot be lent to every test).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from ..errors import TrainingError
from ..utils.files import write_json

#: The exit code of a trial that ran out of memory.
OOM_EXIT = 17
#: The share of the largest size that trained which the answer leaves free.
MARGIN = 0.1
#: Where the first doubling starts with ``auto``.
START = 32
#: The environment variable of the test seam (see the module's docstring).
FAKE_OOM_ENV = "TFGPU_FAKE_OOM_ABOVE"
#: What a trial changes in the recipe: 2 training steps, 1 batch of each evaluation split, nothing kept.
TRIAL = ("train.epochs=1", "train.steps_per_epoch=2", "train.validation_steps=1", "train.test_steps=1",
         "train.steps_per_execution=1", "train.checkpoint=false", "train.max_time=null", "train.progress=none",
         "train.early_stopping=null", "train.profile_steps=null", "train.unfreeze=null", "output.save_model=false",
         "output.tensorboard=false", "output.mlflow=null")
#: Words of the errors that mean "out of memory" when the error's type does not say so (cuDNN, CUDA, XLA).
OOM_WORDS = ("RESOURCE_EXHAUSTED", "out of memory", "OOM when allocating", "CUDNN_STATUS_ALLOC_FAILED",
             "CUDA_ERROR_OUT_OF_MEMORY", "Failed to allocate")


@dataclass
class Search:
    """A finished search.

    Attributes:
        batch: the per-replica batch to train with (the margin taken off).
        largest_ok: the largest size that trained; smallest_oom: the smallest that ran out of memory, or ``None``.
        limited_by: ``"memory"`` (a size failed) or ``"most"`` (none did up to the most tried).
        tried: ``[{size, ok, seconds, why}]`` in order.
        key: the cache key; cached: whether this came from the cache.
    """

    batch: int
    largest_ok: int
    smallest_oom: Optional[int]
    limited_by: str
    tried: list[dict[str, Any]] = field(default_factory=list)
    key: str = ""
    cached: bool = False

    def describe(self) -> str:
        """One line: the answer and how it was found."""
        how = (f"the largest that trained is {self.largest_ok}, {self.smallest_oom} ran out of memory; "
               f"{self.largest_ok} less {MARGIN:.0%}" if self.limited_by == "memory" else
               f"{self.largest_ok} trained and is the most worth trying (the training split over the replicas)")
        return (f"batch_size_per_replica: auto = {self.batch} ({how}"
                + ("; from the cache" if self.cached else f"; {len(self.tried)} trials") + ")")


def cache_file() -> Path:
    """``$XDG_CACHE_HOME/tfgpu/batch_sizes.json`` (``~/.cache/tfgpu/batch_sizes.json``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfgpu" / "batch_sizes.json"


def cache_key(cfg: Any) -> str:
    """What the answer depends on, hashed: the model, the data, the precision, XLA, the loop, accumulation, the
    backend, the devices section and this machine's GPUs (NVML names and memory, no TensorFlow)."""
    from ..devices.probe import probe  # noqa: PLC0415

    gpus = [(g.name, g.memory_total_mib) for g in probe().gpus]
    data = cfg.data.to_dict() if hasattr(cfg.data, "to_dict") else cfg.data.model_dump()
    what = {"model": cfg.model.model_dump(mode="json"), "data": data, "backend": cfg.backend,
            "precision": cfg.tensorflow.mixed_precision, "jit": cfg.tensorflow.jit_compile, "loop": cfg.train.loop,
            "accumulation": cfg.train.gradient_accumulation_steps, "devices": cfg.devices.model_dump(mode="json"),
            "gpus": gpus or "cpu"}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached(key: str) -> Optional[Search]:
    """The search cached under ``key``, or ``None``."""
    try:
        entry = json.loads(cache_file().read_text()).get(key)
    except (OSError, ValueError):
        return None
    return Search(**{**entry, "cached": True}) if isinstance(entry, dict) else None


def _keep(search: Search) -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        table = {}
    table[search.key] = {k: v for k, v in asdict(search).items() if k != "cached"}
    write_json(path, table)


def resolved(cfg: Any, say: Any = print) -> tuple[Any, Optional[Search]]:
    """``cfg`` with ``train.batch_size_per_replica: auto`` replaced by :func:`find`'s answer, and the search
    (``None`` when the batch was given)."""
    if cfg.train.batch_size_per_replica != "auto":
        return cfg, None
    search = find(cfg, say=say)
    say(search.describe())
    train = cfg.train.model_copy(update={"batch_size_per_replica": search.batch})
    return cfg.model_copy(update={"train": train}), search


def find(cfg: Any, start: int = START, most: Optional[int] = None, fresh: bool = False, say: Any = print) -> Search:
    """The largest per-replica batch that trains, from the cache or a search (see the module's docstring).

    Args:
        cfg: the recipe's config (what the trial processes train, the cache key).
        start: the first size tried; most: the largest (default: the training split over the replicas).
        fresh: search even when the cache has an answer.
        say: prints a line per trial.

    Raises:
        TrainingError: a trial failed for another reason than memory (its message is passed on), or even
            ``start`` ran out of memory.
    """
    key = cache_key(cfg)
    if not fresh:
        found = cached(key)
        if found is not None:
            return found
    with tempfile.TemporaryDirectory(prefix="tfgpu-batch-search-") as folder:
        recipe = Path(folder) / "recipe.yaml"  # the config as given (paths are relative to the working folder)
        given = cfg.explicit_dict()
        given.get("output", {}).pop("mlflow", None)  # (its credentials stay out of files; trials track nothing)
        recipe.write_text(yaml.safe_dump(given, sort_keys=False))
        return _search(str(recipe), key, start, most, say)


def _search(recipe: str, key: str, start: int, most: Optional[int], say: Any) -> Search:
    most = most or _most(recipe)
    tried: list[dict[str, Any]] = []

    def trial(size: int) -> bool:
        outcome = _trial(recipe, size)
        tried.append({"size": size, **outcome})
        say(f"batch {size} per replica: " + ("trained" if outcome["ok"] else "out of memory")
            + f" ({outcome['seconds']:.1f} s)")
        return outcome["ok"]

    size = min(start, most)
    if not trial(size):
        if size == 1:
            raise TrainingError("train.batch_size_per_replica: auto: even 1 sample per replica runs out of memory.",
                                "use a smaller model, mixed precision (tensorflow.mixed_precision), or more "
                                "devices.")
        low, high = 0, size
    else:
        low, high = size, None
        while high is None and low < most:
            size = min(low * 2, most)
            if trial(size):
                low = size
            else:
                high = size
    while high is not None and high - low > 1:
        size = (low + high) // 2
        if trial(size):
            low = size
        else:
            high = size
    if low == 0:
        raise TrainingError(f"train.batch_size_per_replica: auto: every size down to {high} ran out of memory.",
                            "use a smaller model, mixed precision, or more devices.")
    batch = max(1, math.floor(low * (1 - MARGIN))) if high is not None else low
    search = Search(batch, low, high, "memory" if high is not None else "most", tried, key)
    _keep(search)
    return search


def _most(recipe: str) -> int:
    """The training split's size over the replicas, from a probe process (the one figure a trial needs first)."""
    return int(_trial(recipe, 1, probe_only=True)["most"])


def _trial(recipe: str, size: int, probe_only: bool = False) -> dict[str, Any]:
    """Train ``size`` per replica in a child process: ``{ok, seconds, why}`` (and ``most`` when probing)."""
    command = [sys.executable, "-m", f"{__package__}.batch_trial", recipe, str(size),
               *(["--probe"] if probe_only else [])]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfgpu-batch-trial-") as scratch:
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TFGPU_TRIAL_DIR": scratch})
    seconds = time.perf_counter() - began
    if done.returncode == 0:
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        return {"ok": True, "seconds": seconds, "why": None, **(json.loads(lines[-1]) if lines else {})}
    if done.returncode in (OOM_EXIT, -signal.SIGKILL):
        why = (done.stderr.strip().splitlines() or ["killed"])[-1] if done.returncode == OOM_EXIT else \
            "the process was killed (SIGKILL: the kernel's OOM killer, most likely)"
        return {"ok": False, "seconds": seconds, "why": why}
    last = "\n".join(done.stderr.strip().splitlines()[-4:])
    raise TrainingError(f"train.batch_size_per_replica: auto: the trial of {size} per replica failed for another "
                        f"reason than memory (exit {done.returncode}): {last}",
                        "fix what the message names (tfgpu run --fast-dev-run shows it at once), then search again.")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is an out-of-memory error of TensorFlow, XLA, cuDNN or CUDA."""
    seen = exc
    while seen is not None:
        if type(seen).__name__ == "ResourceExhaustedError" or any(w in str(seen) for w in OOM_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _fake_callback(batch: int, limit: int) -> Any:
    """The test seam's callback (``TFGPU_FAKE_OOM_ABOVE``): raises ``tf.errors.ResourceExhaustedError`` at the first
    training step when the per-replica batch ``batch`` is above ``limit``."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    class FakeOOM(keras.callbacks.Callback):
        def on_train_batch_begin(self, step: int, logs: Optional[dict] = None) -> None:
            if batch > limit:
                raise tf.errors.ResourceExhaustedError(
                    None, None, f"OOM when allocating tensor with shape[{batch},26,26,16] and type float on "
                                f"/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc "
                                f"({FAKE_OOM_ENV}={limit})")

    return FakeOOM()
