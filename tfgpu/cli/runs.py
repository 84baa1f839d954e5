"""``tfgpu runs`` and ``tfgpu compare``: run directories listed, and runs side by side."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors


@click.command("runs", context_settings=CONTEXT)
@click.argument("directory", metavar="[DIR]", type=click.Path(), default="runs", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (a list, oldest first).")
@handle_errors
def runs(directory: str, as_json: bool) -> None:
    """List the run directories under DIR (default: runs), oldest first.

    \b
    tfgpu runs                                        the runs under runs/
    tfgpu runs runs/ --json                           the same as JSON

    One line per run: status (a "running" whose process has ended shows as
    stale), recipe, start time, epochs done/planned, the main metric (its
    validation copy, e.g. val_accuracy) at its best epoch and at the last one,
    wall time, steady-state training samples/s and the devices. Run
    directories are found below DIR too (a sweep's trials/), without entering
    a run's own folders. Reads only the files; TensorFlow is not started.
    """
    from ..experiments.compare import as_json as to_json, describe_runs, list_runs  # noqa: PLC0415

    rows = list_runs(directory)
    click.echo(to_json(rows) if as_json else describe_runs(rows, directory))



@click.command(context_settings=CONTEXT)
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN RUN...", type=click.Path())
@click.option("--plot", "plot_file", metavar="FILE.png",
              help="Also draw the learning curves (loss and the main metric per epoch, train solid, validation "
                   "dashed) into FILE (.png; .svg, .pdf). Needs pip install 'tfgpu[plots]'.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison (and the plot's curves) as JSON.")
@handle_errors
def compare(run_dirs: tuple[str, ...], plot_file: str | None, as_json: bool) -> None:
    """Compare two or more runs: the settings that differ, the metrics side by side, the learning curves.

    \b
    tfgpu compare runs/a runs/b                       settings and metrics as text
    tfgpu compare runs/a runs/b --plot curves.png     and the curves as a picture

    The settings are every key of each run's config.resolved.yaml, as dotted
    keys (model.optimizer.learning_rate); only those whose values differ are
    shown. Each metric's final value (the kept model's epoch; test_*: the test
    split's) and its best over the epochs (the highest, or the lowest for
    losses and errors) with its epoch. Reads only the files; TensorFlow is not
    started.
    """
    from ..experiments.compare import as_json as to_json, check_plot_file, compare_runs, describe_comparison  # noqa: PLC0415
    from ..experiments.compare import plot_curves  # noqa: PLC0415

    if plot_file is not None:
        check_plot_file(plot_file)
    comparison = compare_runs(run_dirs)
    plot = plot_curves(comparison["runs"], plot_file, comparison["main_metric"]) if plot_file else None
    if as_json:
        click.echo(to_json({**comparison, "plot": plot}))
    else:
        click.echo(describe_comparison(comparison, plot))
