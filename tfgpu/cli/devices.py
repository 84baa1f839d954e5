"""``tfgpu devices``: the GPUs (NVML), MIG instances and TensorFlow's (or JAX's) devices."""

from __future__ import annotations

import json

import click

from .common import CONTEXT, handle_errors, set_device_option


@click.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_device_option
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON (input for 'plan --machine').")
@click.option("--no-tensorflow", is_flag=True,
              help="Do not start TensorFlow (instant: only NVML, and JAX with backend: jax).")
@click.option("--facts", "facts_file", metavar="FILE",
              help="Show the facts in FILE (written by 'tfgpu devices --json' or 'tfgpu doctor --json' on another "
                   "machine) instead of this machine's.")
@handle_errors
def devices(recipe: str | None, overrides: tuple[str, ...], as_json: bool, no_tensorflow: bool,
            facts_file: str | None) -> None:
    """List the GPUs (NVML: index, name, UUID, used/total MiB, compute capability,
    MIG mode, driver and its CUDA version), the MIG instances and which of them
    this process can use, and TensorFlow's physical and logical devices.

    NVML is read without TensorFlow; TensorFlow is started in a child process, so
    this works with no GPU and with a TensorFlow that cannot start. With RECIPE
    (or --set), its device settings are applied first, so the logical devices
    show its splits. With backend: jax (--set backend=jax), JAX is started in a
    child process too, with the config's JAX environment, and its version,
    CUDA plugin and devices are listed; TensorFlow is then started with its
    defaults, and not at all where it is not installed.
    """
    from ..config import load_config  # noqa: PLC0415
    from ..devices.doctor import describe_facts  # noqa: PLC0415
    from ..devices.probe import (Facts, load_facts, probe, probe_jax, probe_packages, probe_tensorflow,
                                 tensorflow_installed)

    cfg = load_config(recipe, overrides=overrides) if (recipe or overrides) else None
    config = cfg.explicit_dict() if cfg is not None else None
    jax = cfg is not None and cfg.backend == "jax"
    if facts_file:
        facts = load_facts(facts_file, "--facts")
    else:
        packages = probe_packages()
        skip_tf = no_tensorflow or (jax and not tensorflow_installed(packages))
        # On JAX the config's device settings are JAX's: TensorFlow (used for data only) keeps its defaults.
        facts = Facts(machine=probe(), packages=packages,
                      tensorflow=None if skip_tf else probe_tensorflow(None if jax else config),
                      jax=probe_jax(config) if jax else None)
    if as_json:
        click.echo(json.dumps(facts.to_dict(), indent=2, default=str))
    else:
        click.echo(describe_facts(facts))
