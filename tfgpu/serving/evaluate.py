"""``tfgpu evaluate RUN_DIR``: reload a run's ``model.keras`` and evaluate it on the run's data (or other data).

The run's ``config.yaml`` (its settings as given; every other key takes its
default, as in the run) is loaded again, with ``--set`` overrides on
top (``--set data.test_path=new/`` evaluates other data), so the same source,
the same ``validation_split`` (same seed, same samples), the same rescaling and
the same global batch are used; relative data paths are read from the
directory the run was started in (``summary.json``'s ``cwd``) unless they were
given again with ``--set``. Results go to ``RUN_DIR/evaluation.json``; an
earlier one is kept as ``evaluation-<time>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config import load_config, parse_override
from ..data import source_for
from ..errors import DataError, OutputError
from ..utils.files import write_json
from ..utils.processes import stale_status

_PATH_KEYS = ("path", "validation_path", "test_path")


#: Overrides :func:`evaluate_run` applies first: the whole validation and test splits.
WHOLE_SPLITS = ("train.validation_steps=null", "train.test_steps=null")


def _read_run(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise DataError(f"tfgpu evaluate: '{run_dir}' is not a run directory (it does not exist or is a file).",
                        "give the folder tfgpu run printed (runs/<recipe>-<time>).")
    missing = [n for n in ("config.yaml", "model.keras") if not (run_dir / n).is_file()]
    if missing:
        why = (" (the run did not save a model: output.save_model was false, or it failed or was interrupted "
               "before the end)") if missing == ["model.keras"] else ""
        raise DataError(f"tfgpu evaluate: {run_dir} has no {' and no '.join(missing)}{why}.",
                        "evaluate a run that completed with output.save_model: true.")
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def evaluate_run(run_dir: str, overrides: Sequence[str] = (), splits: Sequence[str] = ("validation", "test")
                 ) -> dict[str, Any]:
    """Evaluate a run's saved model on its data; write and return ``evaluation.json``'s contents.

    Args:
        run_dir: a directory written by ``tfgpu run`` (with ``config.yaml`` and ``model.keras``).
        overrides: ``--set`` strings applied over the run's config (e.g. other data). The whole validation and
            test splits are evaluated, whatever the run's ``train.validation_steps``/``test_steps``, unless these
            set them.
        splits: which of ``validation`` and ``test`` to evaluate (those the data has).

    Returns:
        ``{"run_dir", "model", "evaluated_at", "overrides", "splits": {name: {"samples",
        "origin", "loss", <metric>: ...}}, "recorded": the run's final metrics}``.

    Raises:
        ConfigError, DeviceError, DataError: as ``tfgpu run`` would for this config.
        OutputError: ``evaluation.json`` cannot be written.

    Wraps: https://keras.io/api/models/model_saving_apis/model_saving_and_loading/ and
    https://keras.io/api/models/model_training_apis/#evaluate-method
    """
    from ..devices.setup import setup  # noqa: PLC0415
    from ..data import load  # noqa: PLC0415
    from ..training.trainer import evaluate_split  # noqa: PLC0415

    folder = Path(run_dir)
    summary = _read_run(folder)
    # the whole splits, whatever the run's train.validation_steps/test_steps cut (an override may cut them again)
    cfg = load_config(folder / "config.yaml", overrides=[*WHOLE_SPLITS, *overrides])
    cfg = _paths_from(cfg, summary.get("cwd"), overrides)
    source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
    source.check()
    info = setup(cfg)
    data, pipes = load(cfg, info, source, train=False)

    import keras  # noqa: PLC0415

    from ..model.schedules import warmup_class  # noqa: PLC0415

    warmup_class()  # registers tfgpu>Warmup, which a model trained with train.lr_schedule holds
    with info.scope():
        try:
            model = keras.models.load_model(folder / "model.keras")
        except Exception as exc:  # a damaged or foreign file
            raise DataError(f"tfgpu evaluate: cannot load {folder / 'model.keras'}: {type(exc).__name__}: {exc}.",
                            "the file is damaged or was not written by tfgpu run; train the run again.") from None
    results: dict[str, Any] = {}
    chosen = {"validation": (pipes.validation, pipes.validation_steps, data.validation),
              "test": (pipes.test, pipes.test_steps, data.test)}
    if data.validation_is_test:  # one split is both: evaluated once, reported under each name asked for
        chosen["test"] = chosen["validation"]
    for name in splits:
        dataset, steps, split = chosen[name]
        if dataset is None:
            continue
        same = next((results[k] for k in results if chosen[k][0] is dataset), None)
        metrics = {k: v for k, v in same.items() if k not in ("samples", "origin")} if same else \
            evaluate_split(model, dataset, steps)
        samples = min(split.size, steps * info.global_batch_size)  # (train.validation_steps/test_steps cut it)
        results[name] = {"samples": samples, "origin": split.origin, **metrics}
        print(f"tfgpu: {name} ({samples:,} samples" + (f" of {split.size:,}" if samples < split.size else "")
              + f", {split.origin}): "
              + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)
    if not results:
        raise DataError(f"tfgpu evaluate: the data has no {' or '.join(splits)} split to evaluate.",
                        "set data.validation_split, data.validation_path or data.test_path (with --set).")
    stale = stale_status(summary)
    if stale:
        print(f"tfgpu: note: {stale}; 'recorded' holds what it wrote last.", flush=True)
    report = {"run_dir": str(folder), "model": str(folder / "model.keras"), "evaluated_at": time.time(),
              "overrides": list(overrides), "data": data.spec.to_dict(), "splits": results,
              "recorded": summary.get("final_metrics", {}), "run_status": summary.get("status"),
              **({"run_status_stale": stale} if stale else {})}
    target = folder / "evaluation.json"
    if target.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(target.stat().st_mtime))
        try:
            target.rename(folder / f"evaluation-{stamp}.json")
        except OSError as exc:
            raise OutputError(f"cannot keep the earlier {target}: {exc.strerror or exc}.",
                              "check the run directory's permissions.") from None
    write_json(target, report)
    print(f"tfgpu: wrote {target}", flush=True)
    return report


def _paths_from(cfg: Any, run_cwd: Optional[str], overrides: Sequence[str]) -> Any:
    """Relative data paths (and a builder's module) of the run's config, read from the run's directory."""
    if not run_cwd:
        return cfg
    given = {parse_override(item)[0] for item in overrides}
    update = {}
    for key in _PATH_KEYS:
        value = getattr(cfg.data, key)
        if value is not None and ("data", key) not in given and not Path(os.path.expandvars(value)).is_absolute() \
                and not value.startswith("~"):
            update[key] = os.path.join(run_cwd, value)
    if cfg.data.kind == "builder" and run_cwd not in sys.path:
        sys.path.append(run_cwd)
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=update)}) if update else cfg
