"""One trial of :mod:`tfgpu.training.batch_finder`, in its own process: the recipe's run at one per-replica batch,
cut to 2 steps (:data:`~tfgpu.training.batch_finder.TRIAL`); exit :data:`~tfgpu.training.batch_finder.OOM_EXIT` when
it ran out of memory. With ``TFGPU_FAKE_OOM_ABOVE`` (the test seam) a size above it fails at its first step with
TensorFlow's ``ResourceExhaustedError``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from .batch_finder import FAKE_OOM_ENV, OOM_EXIT, TRIAL, _fake_callback, is_out_of_memory


def _main(argv: list[str]) -> int:
    """``python -m tfgpu.training.batch_trial RECIPE SIZE [--probe]``: train SIZE per replica, exit 0, or
    :data:`~tfgpu.training.batch_finder.OOM_EXIT` when out of memory; ``--probe``: print the largest size worth
    trying."""
    from ..config import load_config  # noqa: PLC0415
    from ..devices import lean_import  # noqa: PLC0415
    from . import trainer as trainer_module  # noqa: PLC0415
    from .runner import run  # noqa: PLC0415

    lean_import.install()  # as the tfgpu command starts TensorFlow (the optional packages it probes for skipped)
    recipe, size, probe_only = argv[0], int(argv[1]), "--probe" in argv[2:]
    if probe_only:
        from ..data import load, source_for  # noqa: PLC0415
        from ..devices.setup import _setup  # noqa: PLC0415

        cfg = load_config(recipe, overrides=["train.batch_size_per_replica=1"])
        info = _setup(cfg, keep_log=False)
        if cfg.backend == "jax":
            replicas = info.num_replicas
        else:
            replicas = int(info.strategy.num_replicas_in_sync)
        source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
        source.check()
        data, _ = load(cfg, info, source)
        print(json.dumps({"most": max(1, data.train.size // replicas)}), flush=True)
        return 0
    limit = os.environ.get(FAKE_OOM_ENV)
    if limit:
        given = trainer_module.Trainer.callbacks

        def callbacks(self: Any, *args: Any, **kwargs: Any) -> list:
            return [_fake_callback(size, int(limit)), *given(self, *args, **kwargs)]

        trainer_module.Trainer.callbacks = callbacks  # the seam: the run's own callbacks, one raising first
    try:
        result = run(recipe, [f"train.batch_size_per_replica={size}", *TRIAL],
                     os.environ.get("TFGPU_TRIAL_DIR") or tempfile.mkdtemp())
    except BaseException as exc:  # noqa: BLE001  (a trial reports every outcome as its exit code)
        if is_out_of_memory(exc):
            print(f"out of memory: {str(exc).splitlines()[0][:300]}", file=sys.stderr, flush=True)
            return OOM_EXIT
        raise
    print(json.dumps({"samples_per_second": result.summary.get("epochs", [{}])[-1].get("samples_per_second")
                      if result.summary.get("epochs") else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
