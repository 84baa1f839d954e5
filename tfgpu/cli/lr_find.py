"""``tfgpu lr-find``: the learning-rate range test (:mod:`tfgpu.training.lr_find`)."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors, set_option


@click.command("lr-find", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_option
@click.option("-o", "--output", "out", metavar="FILE.png", default="lr_find.png", show_default=True,
              help="The loss curve (PNG, needs the plots extra); the rates and losses go beside it as FILE.csv.")
@click.option("--steps", type=click.IntRange(10, 100_000), default=100, show_default=True,
              help="Optimizer steps the rate grows over (one rate a step).")
@click.option("--low", type=float, default=1e-7, show_default=True, help="The first learning rate.")
@click.option("--high", type=float, default=10.0, show_default=True, help="The last learning rate.")
@handle_errors
def lr_find(recipe: str | None, overrides: tuple[str, ...], out: str, steps: int, low: float, high: float) -> None:
    """Find a learning rate for RECIPE: Smith's range test on its data, model and devices.

    \b
    tfgpu lr-find recipes/mnist.yaml
    tfgpu lr-find recipes/mnist.yaml --steps 200 -o curve.png

    The rate grows exponentially from --low to --high over --steps optimizer
    steps; the test stops early when the loss diverges. It suggests the rate
    where the smoothed loss falls fastest and prints the --set line that gives
    it to the recipe (the recipe's value: train.lr_scaling multiplies it).
    """
    from ..training.lr_find import lr_find as find  # noqa: PLC0415

    result = find(recipe, overrides, out, steps, low, high)
    tried = f"{len(result.rates)} steps from {result.rates[0]:.3g} to {result.rates[-1]:.3g}"
    click.echo(f"tfgpu lr-find: {tried}" + (f" (stopped: the loss {result.stopped})" if result.stopped else ""))
    if result.suggestion is None:
        click.echo("no suggestion: the loss never fell; widen the range (--low, --high) or check the data")
    else:
        recipe_rate = result.suggestion / result.lr_scale
        click.echo(f"suggested learning rate: {result.suggestion:.3g} as applied"
                   + (f" = {recipe_rate:.3g} in the recipe x {result.lr_scale:g} (train.lr_scaling)"
                      if result.lr_scale != 1 else "") + " (the loss's steepest descent)")
        click.echo(f"use it: tfgpu run {recipe or ''} {result.set_line}".replace("  ", " "))
    for file in result.files:
        click.echo(f"wrote {file}")
    if len(result.files) == 1:
        click.echo("no picture: matplotlib is not installed (pip install 'tfgpu[plots]')")
