"""``tfgpu find-batch-size``: the largest per-replica batch that trains (:mod:`tfgpu.training.batch_finder`)."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors, set_option


@click.command("find-batch-size", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_option
@click.option("--start", type=click.IntRange(1, 2**24), default=32, show_default=True,
              help="The first per-replica batch tried; the search doubles from it, then bisects.")
@click.option("--most", type=click.IntRange(1, 2**24), default=None,
              help="The largest tried. Default: the training split over the replicas.")
@click.option("--fresh", is_flag=True, help="Search even when the cache has an answer for this recipe and machine.")
@handle_errors
def find_batch_size(recipe: str | None, overrides: tuple[str, ...], start: int, most: int | None,
                    fresh: bool) -> None:
    """Find the largest per-replica batch RECIPE trains without running out of memory.

    \b
    tfgpu find-batch-size recipes/mnist.yaml
    tfgpu find-batch-size recipes/mnist.yaml --start 256 --fresh

    Each size is tried in a child process (2 training steps of the recipe's
    own run; TensorFlow keeps GPU memory once taken): doubling until one runs
    out of memory, then bisecting. The answer, 10 % under the largest that
    trained, is cached for this recipe's model, data, precision and devices:
    train.batch_size_per_replica: auto then uses it without searching.
    """
    from ..config import load_config  # noqa: PLC0415
    from ..training import batch_finder, preflight  # noqa: PLC0415

    cfg = load_config(recipe, overrides=list(overrides))
    preflight.check(cfg, None)
    search = batch_finder.find(cfg, start=start, most=most, fresh=fresh, say=lambda line: click.echo(line))
    click.echo(search.describe())
    click.echo(f"use it: --set train.batch_size_per_replica={search.batch} (or batch_size_per_replica: auto, "
               f"which reads the cache: {batch_finder.cache_file()})")
