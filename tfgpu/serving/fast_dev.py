"""``tfgpu run --fast-dev-run``: the whole path of a recipe in seconds, on one batch of each split.

One training step, one validation batch and one test batch, a checkpoint and
``model.keras`` saved, the model reloaded from ``model.keras`` and evaluated on
one batch of each evaluation split (:func:`tfgpu.serving.evaluate.evaluate_run`):
every part ``tfgpu run`` would reach, in the recipe's own devices, strategy,
data, model and callbacks, with nothing worth keeping computed. The run
directory goes into a temporary folder that is deleted when it passes, unless
``--keep`` names where to keep it; a run that fails keeps its directory and
says where (Lightning's ``fast_dev_run``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Optional, Sequence

#: The settings a fast dev run adds after the recipe's and ``--set``'s.
SETTINGS = ("train.epochs=1", "train.steps_per_epoch=1", "train.validation_steps=1", "train.test_steps=1",
            "train.steps_per_execution=1", "train.max_time=null", "train.profile_steps=null",
            "train.unfreeze=null", "output.mlflow=null", "output.name=fast-dev-run")


def fast_dev_run(recipe: Optional[str], overrides: Sequence[str] = (), keep: Optional[str] = None) -> list[str]:
    """Run ``recipe`` on one batch of each split, save, reload and evaluate; the lines to print.

    Args:
        recipe: the YAML recipe (``None``: ``TFGPU_CONFIG``, else the defaults).
        overrides: ``--set`` strings, applied before :data:`SETTINGS`.
        keep: a folder to write the run directory under and keep; ``None``: a temporary one, deleted when
            the run passes.

    Raises:
        What :func:`tfgpu.training.runner.run` and :func:`tfgpu.serving.evaluate.evaluate_run` raise; the run
        directory is then kept (the message's hint names it).
    """
    from .evaluate import evaluate_run  # noqa: PLC0415
    from ..utils.console import say  # noqa: PLC0415
    from ..training.runner import run  # noqa: PLC0415

    began = time.perf_counter()
    parent = keep or tempfile.mkdtemp(prefix="tfgpu-fast-dev-run-")
    try:
        result = run(recipe, [*overrides, *SETTINGS], parent)
        evaluated = evaluate_run(str(result.run_dir), ["train.validation_steps=1", "train.test_steps=1"])
    except BaseException:
        if keep is None:
            say(f"the fast dev run's files are kept in {parent}")
        raise
    if keep is None:
        shutil.rmtree(parent, ignore_errors=True)
    splits = ", ".join(f"{name} loss {figures['loss']:.4g}" for name, figures in evaluated["splits"].items())
    return [f"fast dev run passed in {time.perf_counter() - began:.1f} s: 1 training step, 1 validation and 1 test "
            f"batch; checkpoint and model.keras saved; model.keras reloaded and evaluated ({splits or 'no splits'})",
            f"kept in {result.run_dir}" if keep is not None else
            "nothing kept (--keep DIR keeps the run directory)"]
