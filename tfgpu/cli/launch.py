"""``tfgpu launch``: an unmodified script with the config applied (one process or ``--workers N``)."""

from __future__ import annotations

import sys

import click

from .common import CONTEXT, handle_errors, set_option_with, workers_option


@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True})
@set_option_with("devices.memory_growth=true")
@workers_option
@click.option("--log-dir", metavar="DIR", help="Where each worker's log goes with --workers N "
              "(default: tfgpu-logs/launch-<time>).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def launch(overrides: tuple[str, ...], workers: int, log_dir: str | None, command: tuple[str, ...]) -> None:
    """Run an unmodified script with the config applied: tfgpu launch [RECIPE] [OPTIONS] -- SCRIPT [ARGS].

    \b
    tfgpu launch recipes/gpu.yaml -- recipes/scripts/train.py --epochs 1
    tfgpu launch --set devices.cpu_logical_devices=2 -- -m recipes.scripts.train
    tfgpu launch recipes/gpu.yaml --workers 2 -- recipes/scripts/train.py --steps 50

    RECIPE is a .yaml/.yml file (optional; else TFGPU_CONFIG, else the
    defaults). Settings TensorFlow reads from the environment travel that
    way; the rest are applied by tfgpu.setup() in the script's process before
    the script runs as __main__ ('tfgpu plan --launch' shows which). The exit
    code is the script's. With --workers N, N copies run as the workers of a
    MultiWorkerMirroredStrategy on 127.0.0.1 (TF_CONFIG set for each); when
    one fails the others are stopped, and its own exit code is passed on,
    but one killed by a signal or ended by an uncaught exception gives 10
    (as tfgpu run --workers). Ctrl-C, SIGTERM and the requeue signal are
    forwarded to the script; it dies with tfgpu launch.
    """
    from ..launch.workers import launch as run_launch  # noqa: PLC0415

    args = list(command)
    recipe = None
    if args and args[0].lower().endswith((".yaml", ".yml")):
        recipe = args.pop(0)
    if args and args[0] == "--":
        args.pop(0)
    sys.exit(run_launch(recipe, overrides, workers, args, log_dir))
