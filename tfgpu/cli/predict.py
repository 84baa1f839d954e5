"""``tfgpu predict``: a finished run's model on new images, CSV rows or arrays."""

from __future__ import annotations

import click

from .common import CONTEXT, handle_errors, set_option_with


@click.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path())
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--output", "-o", metavar="FILE",
              help="Write the rows to FILE: .csv, .jsonl or .npy by its extension (none: CSV), and the record to "
                   "FILE.json. Default: CSV on stdout.")
@click.option("--top-k", type=click.IntRange(1, None), default=3, show_default=True,
              help="Classes listed per row, most probable first (classifiers).")
@click.option("--batch-size", type=click.IntRange(1, None), metavar="N",
              help="Samples per step over all replicas. Default: the run's batch_size_per_replica x replicas.")
@set_option_with("devices.cpu_logical_devices=2")
@click.option("--skip-bad", is_flag=True,
              help="Leave out image files that cannot be read (listed in the record) instead of failing.")
@handle_errors
def predict(run_dir: str, inputs: tuple[str, ...], output: str | None, top_k: int, batch_size: int | None,
            overrides: tuple[str, ...], skip_bad: bool) -> None:
    """Run RUN_DIR's model on new INPUTs: image files or folders, CSV files, .npy/.npz arrays.

    Inputs are read as the run's data source read them (image size, colour
    mode, interpolation; CSV columns by name), checked before TensorFlow
    starts, and predicted on the run's devices (--set devices.* to change).
    One row per input: its id, the predicted class, its probability and the
    top-k (regression: the value); with labels (class sub-folders, the CSV's
    label column, y in an .npz) also the label, and the accuracy in the record.
    """
    from ..serving.predict import predict as predict_inputs  # noqa: PLC0415

    predict_inputs(run_dir, inputs, output, top_k, batch_size, overrides, skip_bad)
