"""``tfgpu run``: train a recipe (one process, ``--workers N`` local workers, ``--resume``, ``--dry-run``)."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors, set_option, workers_option


#: ``tfgpu run --max-restarts`` default: how many times a failed worker group is restarted.
MAX_RESTARTS = 3



@click.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_option
@click.option("--output-dir", metavar="DIR", help="Parent of the run directory (overrides output.dir).")
@workers_option
@click.option("--resume", "resume", metavar="RUN_DIR",
              help="Continue the run in RUN_DIR from its last checkpoint (a RUN_DIR that does not exist yet gets "
                   "a new run: for job scripts that are requeued).")
@click.option("--max-restarts", type=click.IntRange(0, 1000), default=MAX_RESTARTS, show_default=True,
              help="With --workers N: restart the workers from the last checkpoint up to this many times when "
                   "one crashes or is killed.")
@click.option("--dry-run", is_flag=True,
              help="Do everything before training, then stop and write nothing: check the recipe, start "
                   "TensorFlow, load the data, build the model, optimizer, loss and metrics and run them on two "
                   "training samples, build the callbacks (with --resume: check the run it would continue). Not "
                   "with --workers N.")
@click.option("--fast-dev-run", is_flag=True,
              help="The whole path in seconds: 1 training step, 1 validation and 1 test batch, checkpoint and "
                   "model.keras saved, reloaded and evaluated; nothing kept unless --keep. Not with --workers, "
                   "--resume or --dry-run.")
@click.option("--keep", metavar="DIR", help="With --fast-dev-run: write the run directory under DIR and keep it.")
@handle_errors
def run(recipe: str | None, overrides: tuple[str, ...], output_dir: str | None, workers: int, resume: str | None,
        max_restarts: int, dry_run: bool, fast_dev_run: bool, keep: str | None) -> None:
    """Train RECIPE's model under its tf.distribute strategy and write a run directory.

    \b
    tfgpu run recipes/mnist.yaml
    tfgpu run --resume runs/mnist-20261123-101500     continue a killed run
    tfgpu run recipes/mnist.yaml --workers 2          two local workers

    With --workers N (N > 1), N local workers train together under
    MultiWorkerMirroredStrategy; the chief writes the run directory and each
    worker's output is kept in RUN_DIR/workers/; a worker that crashes or is
    killed restarts the group from the last checkpoint (--max-restarts), and
    with no restart left the run exits with 10; a worker's own error code
    (3-8) is passed on. On a cluster (TF_CONFIG, Slurm, distribute.cluster),
    run it once per worker without --workers. SIGTERM and the requeue signal
    (train.checkpoint.requeue_signal, SIGUSR1) save a checkpoint and exit
    with 75; with --workers they are forwarded to the workers, which die
    with this process.

    --fast-dev-run trains 1 step, validates and tests 1 batch, saves,
    reloads model.keras and evaluates it, in a temporary run directory
    deleted when it passes (--keep DIR keeps it): a recipe's whole path in
    seconds.

    --dry-run stops where the run directory would be written (exit 0) and
    writes nothing: it catches what 'tfgpu plan RECIPE' cannot, such as a
    model that does not fit the data's shape, a loss that does not fit its
    labels or a callback argument Keras refuses. It runs in one process: for --workers N, 'tfgpu plan RECIPE
    --workers N' checks the recipe and shows worker 0's plan.
    """
    from ..errors import ConfigError  # noqa: PLC0415
    from ..training.runner import dry_run as dry_run_recipe, run as run_recipe, run_workers  # noqa: PLC0415

    if recipe is None and resume is None:
        raise ConfigError("tfgpu run: no recipe was given (received neither RECIPE nor --resume RUN_DIR).",
                          "name a recipe (tfgpu run recipes/mnist.yaml) or a run to continue "
                          "(tfgpu run --resume runs/NAME).")
    if dry_run and workers > 1:
        raise click.UsageError(
            f"--dry-run checks one process and cannot start --workers {workers}; check the recipe and worker 0's "
            f"plan with 'tfgpu plan RECIPE --workers {workers}', or leave --workers out to dry-run the model "
            "against the data in one process.")
    if keep is not None and not fast_dev_run:
        raise click.UsageError("--keep DIR goes with --fast-dev-run (a run's directory is always kept).")
    if fast_dev_run:
        others = [name for name, given in (("--workers", workers > 1), ("--resume", resume), ("--dry-run", dry_run),
                                           ("--output-dir", output_dir)) if given]
        if others:
            raise click.UsageError(f"--fast-dev-run runs one process on a throw-away run directory; it does not "
                                   f"take {', '.join(others)} (--keep DIR keeps its run directory).")
        from ..serving.fast_dev import fast_dev_run as fast  # noqa: PLC0415

        for line in fast(recipe, overrides, keep):
            click.echo(line)
        return
    if dry_run:
        for line in dry_run_recipe(recipe, overrides, output_dir, resume=resume):
            click.echo(line)
    elif workers > 1:
        run_workers(recipe, overrides, output_dir, workers, resume=resume, max_restarts=max_restarts)
    else:
        run_recipe(recipe, overrides, output_dir, resume=resume)
