"""train.early_stopping and train.callbacks: bad input refused before anything is written, and real trainings on
the breast-cancer CSV where early stopping stops, model.keras and summary.json's final_metrics are the best
epoch's, ReduceLROnPlateau lowers the rate, a user's callback sees Keras's hooks in fit's order (both loops), and
--resume continues the count."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ..conftest import RECIPES, one_paragraph, run_cli

RECIPE = str(RECIPES / "breast_cancer.yaml")
EARLY = "train.early_stopping={patience: 3, restore_best_weights: true}"


def _run(tmp_path: Path, *sets: str, args: tuple = ()):
    argv = ["run", RECIPE, "--output-dir", str(tmp_path / "runs"), "--set", "train.epochs=40"]
    for s in sets:
        argv += ["--set", s]
    return run_cli(*argv, *args)


def _refused(result, *words: str) -> str:
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-3000:]
    one_paragraph(result.stderr)
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


def _rows(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _run_dir(tmp_path: Path) -> Path:
    dirs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


# --- bad input: exit 3, nothing written ------------------------------------------------------------------------


def test_unknown_callback_name_lists_the_valid_ones_before_tensorflow(tmp_path):
    err = _refused(run_cli("plan", RECIPE, "--set", "train.callbacks=[{ReduceLROnPlateu: {patience: 2}}]"),
                   "train.callbacks[0]", "'ReduceLROnPlateu'", "Did you mean 'ReduceLROnPlateau'?", "ModelCheckpoint",
                   "module:Class")
    assert "CSVLogger" not in err  # tfgpu's own are not offered


@pytest.mark.parametrize("name,key", [("CSVLogger", "metrics.csv"), ("TensorBoard", "output.tensorboard"),
                                      ("BackupAndRestore", "train.checkpoint"), ("EarlyStopping", "train.early_stopping"),
                                      ("ProgbarLogger", "train.progress")])
def test_callbacks_tfgpu_owns_are_refused_pointing_at_the_key(tmp_path, name, key):
    _refused(run_cli("plan", RECIPE, "--set", f"train.callbacks=[{name}]"), "train.callbacks", name, key)


def test_a_missing_user_module_and_a_schedule_with_reduce_lr_are_refused(tmp_path):
    _refused(run_cli("plan", RECIPE, "--set", "train.callbacks=['no_such_pkg.cbs:Mine']"),
             "train.callbacks[0]", "no_such_pkg")
    _refused(run_cli("plan", RECIPE, "--set", "train.lr_schedule={name: cosine}",
                     "--set", "train.callbacks=[ReduceLROnPlateau]"),
             "train.callbacks[0]", "ReduceLROnPlateau", "LearningRateSchedule", "train.lr_schedule")
    _refused(run_cli("plan", RECIPE, "--set", "train.early_stopping={monitor: epoch_seconds}"),
             "train.early_stopping.monitor", "timing")


@pytest.mark.slow
def test_a_monitor_the_run_does_not_log_lists_those_it_does_and_writes_nothing(tmp_path):
    err = _refused(_run(tmp_path, "train.early_stopping={monitor: val_auc}"),
                   "train.early_stopping.monitor", "'val_auc'", "val_loss", "val_accuracy", "accuracy")
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # Without validation data there is no val_loss to watch (the default monitor).
    _refused(_run(tmp_path, "data.validation_split=null", "train.early_stopping=true"),
             "train.early_stopping.monitor", "'val_loss'")
    _refused(_run(tmp_path, "train.callbacks=[{ReduceLROnPlateau: {monitor: val_precision}}]"),
             "train.callbacks[0].monitor", "'val_precision'")


@pytest.mark.slow
def test_a_user_class_that_is_no_callback_is_refused(tmp_path):
    _refused(_run(tmp_path, "train.callbacks=[{'tests.callback_hooks:NotACallback': {path: x}}]"),
             "train.callbacks[0]", "keras.callbacks.Callback")


@pytest.mark.slow
def test_arguments_a_callback_refuses_stop_dry_run_and_run_before_anything_is_written(tmp_path):
    """Keras's ReduceLROnPlateau refuses factor >= 1.0 in its constructor: ``--dry-run`` builds the callbacks as
    ``run`` does and refuses the recipe (it passed before), and ``run`` refuses it before the run directory
    (it wrote one, then failed), with the same one-paragraph error."""
    out = tmp_path / "runs"
    argv = ("run", RECIPE, "--set", "train.callbacks=[{ReduceLROnPlateau: {factor: 2.0}}]", "--output-dir", str(out))
    words = ("train.callbacks[0]", "ReduceLROnPlateau", "{factor: 2.0}", "factor >= 1.0", "Fix:", "monitor, factor")
    dry = _refused(run_cli(*argv, "--dry-run"), *words)
    assert not out.exists()
    real = _refused(run_cli(*argv), *words)
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
    assert dry.splitlines()[-2:] == real.splitlines()[-2:]  # the same error (its message and its fix)


# --- real training ---------------------------------------------------------------------------------------------


def _hooks(run_dir: Path) -> list[str]:
    return (run_dir / "hooks.txt").read_text().splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("loop,monitor", [("fit", "val_loss"), ("custom", "val_accuracy")])
def test_early_stopping_keeps_the_best_epoch_and_callbacks_run(tmp_path, loop, monitor):
    """Early stopping keeps the best epoch's model, and summary.json's final_metrics (with final_metrics_epoch) are
    that epoch's figures; ReduceLROnPlateau, ModelCheckpoint and a user's callback run.
    Trains its own run: the settings under test (early stopping and callbacks) change the training."""
    result = _run(tmp_path, f"train.loop={loop}", "train.progress=epoch",
                  f"train.early_stopping={{patience: 3, restore_best_weights: true, monitor: {monitor}}}",
                  "train.callbacks=[{ReduceLROnPlateau: {patience: 1, factor: 0.5}}, "
                  "{'tests.callback_hooks:HookRecorder': {path: hooks.txt}}, "
                  "{ModelCheckpoint: {filepath: best.keras, save_best_only: true}}]")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = _run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = _rows(run_dir)
    es = summary["early_stopping"]
    assert summary["status"] == "completed"
    assert es["stopped_epoch"] == len(rows) < 40 and summary["epochs_completed"] == len(rows)
    best = (min if monitor == "val_loss" else max)(rows, key=lambda r: r[monitor])
    assert es["best_epoch"] == int(best["epoch"]) + 1 and es["best_value"] == pytest.approx(best[monitor])
    assert es["restored_best_weights"] is True and es["best_epoch"] < es["stopped_epoch"]
    assert not (run_dir / "early_stopping_best.npz").exists()
    # model.keras is the best epoch's model: evaluate reproduces its row, not the last one.
    evaluated = run_cli("evaluate", str(run_dir))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    validation = json.loads((run_dir / "evaluation.json").read_text())["splits"]["validation"]
    assert validation["loss"] == pytest.approx(best["val_loss"], abs=1e-4), (validation, best)
    assert validation["accuracy"] == pytest.approx(best["val_accuracy"], abs=1e-4), (validation, best)
    assert abs(rows[-1]["val_loss"] - best["val_loss"]) > 1e-3  # (the last epoch's model would differ)
    # What tfgpu records as the result describes that kept model: final_metrics are the best epoch's row (of
    # metrics.csv and summary.json's epochs, which keeps every epoch), as evaluate finds them; so do runs' FINAL.
    final = summary["final_metrics"]
    assert summary["final_metrics_epoch"] == es["best_epoch"] and len(summary["epochs"]) == len(rows)
    assert set(final) == {"loss", "accuracy", "val_loss", "val_accuracy"}, final
    for key in final:
        assert final[key] == pytest.approx(best[key], abs=1e-4), (key, final, best)
        assert final[key] == summary["epochs"][es["best_epoch"] - 1][key]
    assert validation["loss"] == pytest.approx(final["val_loss"], abs=1e-4), (validation, final)
    listed = json.loads(run_cli("runs", str(run_dir), "--json").stdout)
    assert listed[0]["final"] == pytest.approx(final[listed[0]["metric"]]), listed
    # ReduceLROnPlateau lowered the rate (metrics.csv's learning_rate column).
    rates = [r["learning_rate"] for r in rows]
    assert rates[0] == pytest.approx(0.01) and min(rates) < 0.01, rates
    # ModelCheckpoint's relative filepath is inside the run directory.
    assert (run_dir / "best.keras").is_file()
    # The user's callback got every hook, in fit's order.
    hooks = _hooks(run_dir)
    assert hooks[0] == "on_train_begin" and hooks[-1] == "on_train_end"
    assert hooks.count("on_train_begin") == 1 and hooks.count("on_train_end") == 1
    epoch0 = hooks[1:hooks.index(next(h for h in hooks if h.startswith("on_epoch_end 0"))) + 1]
    kinds = [h.split()[0] for h in epoch0]
    assert kinds[0] == "on_epoch_begin" and kinds[-1] == "on_epoch_end"
    assert kinds[1:3] == ["on_train_batch_begin", "on_train_batch_end"]
    assert kinds.index("on_test_begin") < kinds.index("on_test_batch_begin") < kinds.index("on_test_batch_end") \
        < kinds.index("on_test_end") < kinds.index("on_epoch_end")
    assert "val_loss" in epoch0[-1] and "loss" in epoch0[-1]
    assert sum(h.startswith("on_epoch_end") for h in hooks) == len(rows)


@pytest.mark.slow
def test_resume_continues_the_count_and_restores_the_best_epoch_from_before_it(tmp_path):
    """Killed as its last epoch begins (the best came earlier), then resumed: the same stop, best epoch and model
    as a run that was never killed.
    Trains its own runs: it kills a run with early stopping and resumes it, which a shared run must not suffer."""
    sets = ("train.progress=epoch", EARLY)
    whole = _run(tmp_path / "whole", *sets)
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference = json.loads((_run_dir(tmp_path / "whole") / "summary.json").read_text())["early_stopping"]
    # Killed as the last epoch begins: the best epoch came before, the stop comes after.
    kill = reference["stopped_epoch"] - 1  # (from 0)
    assert reference["best_epoch"] <= kill, reference
    killed = _run(tmp_path, *sets,
                  f"train.callbacks=[{{'tests.callback_hooks:KillAt': {{epoch: {kill}, marker_file: killed}}}}]")
    assert killed.returncode != 0
    run_dir = _run_dir(tmp_path)
    assert (run_dir / "killed").is_file()  # (a relative *_file argument is inside the run directory)
    assert (run_dir / "early_stopping_best.npz").is_file()
    resumed = run_cli("run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    es = summary["early_stopping"]
    assert {k: es[k] for k in ("stopped_epoch", "best_epoch")} == \
        {k: reference[k] for k in ("stopped_epoch", "best_epoch")}
    assert es["best_value"] == pytest.approx(reference["best_value"], rel=1e-4) and es["restored_best_weights"]
    rows = _rows(run_dir)
    best = rows[es["best_epoch"] - 1]
    evaluated = run_cli("evaluate", str(run_dir))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    validation = json.loads((run_dir / "evaluation.json").read_text())["splits"]["validation"]
    assert validation["loss"] == pytest.approx(best["val_loss"], abs=1e-4), (validation, best)
    assert summary["final_metrics_epoch"] == es["best_epoch"]  # the restored epoch, from before the resume
    assert summary["final_metrics"]["val_loss"] == pytest.approx(best["val_loss"], abs=1e-4), summary["final_metrics"]
