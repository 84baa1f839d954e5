"""``tfgpu plan``: the checks before TensorFlow starts and what a run would apply, without TensorFlow."""

from __future__ import annotations

import json
import os

import click

from .common import CONTEXT, handle_errors, machine_option, set_option


@click.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_option
@machine_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the config, the plan and (with RECIPE) what the run trains as JSON.")
@click.option("--launch", "for_launch", is_flag=True,
              help="Also show how 'tfgpu launch' passes each setting: by environment or by its bootstrap.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Plan as worker 0 of N local workers ('tfgpu run --workers N'); starts nothing.")
@click.option("--parallel", type=click.IntRange(1, 1024), metavar="K",
              help="With a sweep: section: plan the slots of 'tfgpu sweep --parallel K'.")
@handle_errors
def plan(recipe: str | None, overrides: tuple[str, ...], machine: str | None, as_json: bool, for_launch: bool,
         workers: int, parallel: int | None) -> None:
    """Check RECIPE and show what `run` / tfgpu.setup() would do, without importing TensorFlow.

    With RECIPE, first every check 'tfgpu run' makes before TensorFlow starts,
    with the same messages and exit codes (3 config, 5 data, 8 output): a
    model is defined, its layer, optimizer, loss and metric names exist in
    Keras, a model.builder's module can be found, and the data's local files
    are there and readable (--machine: the files are not checked). Then what
    the run trains (data, model, loss, optimizer, epochs, loop, batch) and the
    resolved config's effect: environment variables, tf.config calls in
    order, the strategy, replicas, per-replica and global batch, and
    warnings. Without RECIPE (or with --launch): only the plan of the file
    named by TFGPU_CONFIG, else the defaults. 'tfgpu run RECIPE --dry-run'
    goes further: it starts TensorFlow and runs the model on the data.
    With a sweep: section, also the sweep's slots: the devices each trial
    process gets ('tfgpu sweep').
    """
    from ..devices.plan import make_plan  # noqa: PLC0415
    from ..training.preflight import check, describe_lines, describe_run  # noqa: PLC0415
    from ..devices.probe import load_facts, probe  # noqa: PLC0415

    from ..launch.workers import as_worker_zero, load_for_workers  # noqa: PLC0415

    cfg, _ = load_for_workers(recipe, overrides, workers)
    checked = recipe is not None and not for_launch  # what 'tfgpu run RECIPE' checks; a launched script has its own
    if checked:
        check(cfg, files=machine is None, keep=False)  # the same checks, as cheaply as the files allow
    if cfg.train.batch_size_per_replica == "auto" and machine is None:
        from ..training.batch_finder import cached, cache_key  # noqa: PLC0415

        found = cached(cache_key(cfg))  # the answer tfgpu run would read (no search here: plan runs nothing)
        if found is not None:
            click.echo(f"Note: {found.describe()}", err=True)
            cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"batch_size_per_replica": found.batch})})
    machine_probe = load_facts(machine).machine if machine else probe()
    machine_probe = as_worker_zero(machine_probe, [12345 + i for i in range(workers)])  # example ports
    result = make_plan(cfg, machine_probe)
    run_block = {**describe_run(cfg, result), "files_checked": machine is None} if checked else None
    slots = None
    if cfg.sweep is not None:
        from ..experiments.placement import plan_slots, slot_lines  # noqa: PLC0415
        from ..experiments.sweep import prepare  # noqa: PLC0415

        if recipe:
            prepare(recipe, overrides, None, None)  # the parameters, as tfgpu sweep checks them
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        slots = plan_slots(cfg, machine_probe, parallel, cores)
    settings = None
    if for_launch:
        from ..launch.workers import launch_settings  # noqa: PLC0415

        settings = launch_settings(result, workers)
    if as_json:
        data = {"config": cfg.to_dict(), "machine": machine_probe.to_dict(), "plan": result.to_dict()}
        if run_block is not None:
            data["run"] = run_block
        if settings is not None:
            data["launch"] = [{"key": r.key, "how": r.how, "what": r.what} for r in settings]
        if slots is not None:
            data["sweep"] = {"trials": cfg.sweep.trials, "slots": [slot.to_dict() for slot in slots]}
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if machine:
        click.echo(f"Machine: {machine}")
    elif machine_probe.nvml_error:
        click.echo(f"NVML: {machine_probe.nvml_error} (planning for the CPU; 'tfgpu doctor' explains)")
    if run_block is not None:
        click.echo("\n".join(describe_lines(run_block)))
        if machine:
            click.echo("  (--machine: the output folder and the data files were not checked; they are that machine's)")
    click.echo(result.describe())
    if workers > 1:
        click.echo(f"(--workers {workers}: each worker gets its own TF_CONFIG with a free port; the ports above "
                   "are examples, and this is worker 0's plan)")
    if settings is not None:
        from ..launch.workers import describe_settings  # noqa: PLC0415

        click.echo(describe_settings(settings))
    if slots is not None:
        click.echo("\n".join(slot_lines(slots, cfg.sweep.trials)))
