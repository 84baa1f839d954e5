"""``tfgpu evaluate``: a finished run's model on its validation/test data (or other data)."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors, set_option_with


@click.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path())
@set_option_with("data.test_path=photos/new")
@click.option("--split", "splits", type=click.Choice(["validation", "test", "all"]), default="all", show_default=True,
              help="Which split to evaluate.")
@handle_errors
def evaluate(run_dir: str, overrides: tuple[str, ...], splits: str) -> None:
    """Reload RUN_DIR/model.keras and evaluate it on the run's validation and test data.

    The run's config.yaml is used again (same data, same validation_split and
    seed, same rescaling), with --set on top for other data, e.g.
    --set data.test_path=photos/new. Writes RUN_DIR/evaluation.json (an
    earlier one is kept as evaluation-<time>.json).
    """
    from ..serving.evaluate import evaluate_run  # noqa: PLC0415

    evaluate_run(run_dir, overrides, ("validation", "test") if splits == "all" else (splits,))
