"""``tfgpu doctor``: the "why does TensorFlow not see my GPU?" checklist."""

from __future__ import annotations

import json
import sys

import click

from .common import CONTEXT, handle_errors, set_option_with


@click.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_option_with("devices.memory_growth=true")
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the facts as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors (for health checks).")
@click.option("--strict", is_flag=True, help="Exit 9 on warnings too.")
@click.option("--facts", "facts_file", metavar="FILE",
              help="Diagnose the facts in FILE (from 'tfgpu doctor --json' or 'tfgpu devices --json') "
                   "instead of this machine.")
@click.option("--no-tensorflow", is_flag=True, help="Do not start TensorFlow (skips the TensorFlow checks).")
@click.option("--smoke", is_flag=True,
              help="Also run a short real check on the devices RECIPE trains on: a known step on each device, "
                   "all-reduce exact sums over all of them and each pair with every cross-device ops that can work, "
                   "and copy bandwidth per pair against the link NVML reports.")
@click.option("--log", "show_log", is_flag=True,
              help="Also print TensorFlow's start-up log, each line with whether 'tfgpu run' shows it at the "
                   "config's tensorflow.log_level and why it is harmless where that is known.")
@handle_errors
def doctor(recipe: str | None, overrides: tuple[str, ...], as_json: bool, quiet: bool, strict: bool,
           facts_file: str | None, no_tensorflow: bool, smoke: bool, show_log: bool) -> None:
    """Find out why TensorFlow does not see or use the GPU, and how to fix it.

    Checks the platform, the NVIDIA driver and NVML, CUDA_VISIBLE_DEVICES, the
    TensorFlow packages and build, each CUDA/cuDNN library TensorFlow loads, the
    driver's CUDA version, each GPU's compute capability, what TensorFlow sees,
    memory in use, /dev/shm's size where NCCL would use it, and the tfgpu config (RECIPE, else TFGPU_CONFIG, else the
    defaults) against the GPUs. With backend: jax it also starts JAX (a child
    process) and checks jax, jaxlib, the CUDA plugin and JAX's devices;
    TensorFlow's GPU checks then stay silent (it only reads data), and so does
    a TensorFlow that is not installed. It names TensorFlow's start-up errors
    that are known to be harmless (--log: every start-up line, explained).
    Exits 9 when it finds an error.

    --smoke applies RECIPE's device settings in this process and checks that
    the devices really compute and all-reduce right (docs/doctor.md, "Smoke
    test"): each failure is an error with its fix in tfgpu's keys.
    """
    from ..config import load_config  # noqa: PLC0415
    from ..devices.doctor import Finding, describe_startup_log, diagnose, report, startup_lines  # noqa: PLC0415
    from ..errors import ConfigError  # noqa: PLC0415
    from ..devices.probe import gather_facts, load_facts  # noqa: PLC0415

    if smoke and facts_file:
        raise click.UsageError("--smoke runs its checks on this machine's devices, and --facts diagnoses another "
                               "machine's facts from a file: use one of them.")
    findings_pre: list = []
    try:
        config = load_config(recipe, overrides=overrides)
    except ConfigError as exc:
        config = None
        findings_pre.append(Finding("config", "error", "tfgpu config", exc.message, exc.hint))
    jax = config is not None and config.backend == "jax"
    facts = (load_facts(facts_file, "--facts") if facts_file
             else gather_facts(tensorflow=not no_tensorflow, jax=jax))
    findings = diagnose(facts, config) + findings_pre
    smoke_report = None
    if smoke:
        from ..devices.smoke import smoke_config, verdicts  # noqa: PLC0415

        if config is None:
            findings.append(Finding("smoke", "error", "Smoke test", "not run: the config above could not be loaded.",
                                    "fix the config, then run 'tfgpu doctor --smoke' again."))
        elif config.distribute.strategy == "multi_worker_mirrored":
            findings.append(Finding(
                "smoke", "error", "Smoke test",
                "not run: distribute.strategy is multi_worker_mirrored, and the smoke test checks one machine's "
                "devices in one process (it would wait for the cluster's other workers).",
                "run it on each machine with --set distribute.strategy=mirrored: every device and pair there."))
        else:
            smoke_report = smoke_config(config)
            findings += verdicts(smoke_report)
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    if as_json:
        data = {"errors": errors, "warnings": warnings, "findings": [f.to_dict() for f in findings],
                "facts": facts.to_dict()}
        if smoke_report is not None:
            data["smoke"] = smoke_report.to_dict()
        if show_log:
            data["startup_log"] = startup_lines(facts, config)
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        if smoke_report is not None and not quiet:
            from ..devices.smoke import describe  # noqa: PLC0415

            click.echo(describe(smoke_report))
        text = report(findings, quiet=quiet)
        if text:
            click.echo(text)
        if show_log:
            click.echo(describe_startup_log(facts, config))
    if errors or (strict and warnings):
        sys.exit(9)
