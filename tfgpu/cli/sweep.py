"""``tfgpu sweep``: an Optuna search whose trials are ``tfgpu run`` processes."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors, set_option_with


@click.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_option_with("train.epochs=10")
@click.option("--trials", type=click.IntRange(1, 100_000), metavar="N",
              help="Trials in all (overrides sweep.trials; with several sweep processes on one storage: together).")
@click.option("--parallel", type=click.IntRange(1, 1024), metavar="K",
              help="Trials at a time: on a host without GPUs, K slots sharing the CPU cores (default 1); on a GPU "
                   "host, at most K of the slots sweep.per_trial gives (default all).")
@click.option("--storage", metavar="URL",
              help="The study's storage: a database URL Optuna supports (sqlite:///FILE, postgresql://...) or a "
                   "journal file, shared by sweep processes on several machines (default SWEEP_DIR/study.journal).")
@click.option("--study", "study_name", metavar="NAME", help="The study's name in the storage (default: the sweep "
              "directory's name; give the same NAME to every process that shares a storage).")
@click.option("--sweep", "sweep_file", metavar="FILE", help="Take the sweep: section from FILE instead of RECIPE.")
@click.option("--output-dir", metavar="DIR", help="Parent of the sweep directory (overrides output.dir).")
@click.option("--resume", "resume", metavar="SWEEP_DIR",
              help="Continue a stopped or killed sweep: finished trials are kept, interrupted ones continue from "
                   "their checkpoints.")
@handle_errors
def sweep(recipe: str | None, overrides: tuple[str, ...], trials: int | None, parallel: int | None,
          storage: str | None, study_name: str | None, sweep_file: str | None, output_dir: str | None,
          resume: str | None) -> None:
    """Search RECIPE's sweep: parameters with Optuna, one 'tfgpu run' per trial, packed onto the devices.

    \b
    tfgpu sweep recipes/breast_cancer_sweep.yaml --parallel 2
    tfgpu sweep --resume runs/breast_cancer_sweep-sweep-20261126-101500     after Ctrl-C or a kill

    'tfgpu run SWEEP_DIR/best.yaml' trains the best trial again.

    Each trial is an ordinary run (its own run directory under SWEEP_DIR/trials/,
    checkpoints, every check) in its own process, pinned to its slot: a GPU,
    a share of one (sweep.per_trial.gpus: 0.5), a MIG instance, or on a host
    without GPUs its share of the CPU cores (--parallel K). 'tfgpu plan RECIPE'
    shows the slots. The sweep directory holds the study (study.journal),
    results.csv (also printed) and best.yaml. Exit 12 when no trial completes;
    Ctrl-C and SIGTERM stop the trials with checkpoints (exit 130 / 75).
    """
    from ..experiments.sweep import run_sweep  # noqa: PLC0415

    run_sweep(recipe, overrides, trials=trials, parallel=parallel, storage=storage, resume=resume,
              study_name=study_name, sweep_file=sweep_file, output_dir=output_dir)
