"""``tfgpu bench``: timing exercises for this machine's devices (d2l.ai's GPU chapter)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..devices.bench import DEFAULT_SIZES as _DEFAULT_SIZES  # the standard library only at load
from ..devices.bench import MAX_SIZE as _MAX_SIZE

from .common import CONTEXT, handle_errors, set_device_option


class _Sizes(click.ParamType):
    """Comma-separated matrix sides, e.g. ``256,512,1024``: each an integer from 1 to 65536."""

    name = "N,N,..."

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        sizes = []
        for part in parts:
            try:
                n = int(part)
            except ValueError:
                n = 0
            if not 1 <= n <= _MAX_SIZE or not part.isdigit():
                where = f" (in {value!r})" if len(parts) > 1 else ""
                self.fail(f"{part!r}{where} is not a matrix size; expected comma-separated integers "
                          f"from 1 to {_MAX_SIZE}, e.g. --sizes 256,512,1024.", param, ctx)
            sizes.append(n)
        return tuple(sizes)



_SIZE = click.IntRange(1, _MAX_SIZE)



_repeats_option = click.option(
    "--repeats", type=click.IntRange(min=1), default=5, show_default=True,
    help="Timed runs of each measurement, after one untimed warm-up; the median is reported.",
)



_bench_json_option = click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")



@click.group(context_settings=CONTEXT)
def bench() -> None:
    """Time your hardware: the timing exercises of the d2l.ai "GPUs" chapter.

    \b
    tfgpu bench matmul                    matmul ms and GFLOP/s per device and size
    tfgpu bench logging                   logging a norm to the host per step vs on the device
    tfgpu bench devices --set devices.cpu_logical_devices=2
                                          the same work on one device vs split across devices
    tfgpu bench input RECIPE              the input pipeline alone vs the model's step:
                                          input-bound or not

    Each applies RECIPE's device settings (or --set; default: the defaults)
    first, so its logical devices are timed, and prints a table (--json: the
    data). All three work on a machine without a GPU.
    """



def _bench_setup(recipe: str | None, overrides: tuple[str, ...]) -> dict[str, Any]:
    from ..devices.bench import configure, environment  # noqa: PLC0415

    configure(recipe, overrides)
    return environment()



@bench.command("matmul", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_device_option
@click.option("--sizes", type=_Sizes(), default=",".join(map(str, _DEFAULT_SIZES)), show_default=True,
              help="Matrix sides n (comma-separated): (n, n) @ (n, n) float32.")
@_repeats_option
@_bench_json_option
@handle_errors
def bench_matmul(recipe: str | None, overrides: tuple[str, ...], sizes: tuple[int, ...], repeats: int,
                 as_json: bool) -> None:
    """Matmul time (ms) and GFLOP/s per device and size.

    Square float32 (n, n) @ (n, n) on each logical device (the CPUs, then the
    GPUs): median time per matmul in ms (min-max beside it) and GFLOP/s =
    2 n^3 / time. The best CPU figure is kept as this CPU's peak for the MFU
    'tfgpu run' reports (~/.cache/tfgpu/cpu_peak.json).
    """
    from ..devices.bench import bench_matmul as measure, describe_environment, describe_matmul  # noqa: PLC0415
    from ..devices.bench import record_cpu_peak  # noqa: PLC0415

    env = _bench_setup(recipe, overrides)
    rows = measure(sizes, repeats)
    record_cpu_peak(rows)  # the CPU's figure for MFU (tfgpu.devices.peaks)
    if as_json:
        click.echo(json.dumps({**env, "repeats": repeats, "rows": [r.to_dict() for r in rows]}, indent=2))
    else:
        click.echo(describe_environment(env))
        click.echo(describe_matmul(rows, repeats))



@bench.command("logging", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_device_option
@click.option("--steps", type=click.IntRange(min=1), default=1000, show_default=True, help="Matmuls per run.")
@click.option("--size", type=_SIZE, default=100, show_default=True, help="Matrix side n (float32).")
@_repeats_option
@_bench_json_option
@handle_errors
def bench_logging(recipe: str | None, overrides: tuple[str, ...], steps: int, size: int, repeats: int,
                  as_json: bool) -> None:
    """Log a norm per step to the host vs on the device.

    STEPS float32 (SIZE, SIZE) matmuls, logging each result's Frobenius norm:
    to the host every step (float(), one device-to-host transfer per step),
    or kept on the device and transferred once at the end. Runs on the first
    GPU, else the CPU.
    """
    from ..devices.bench import bench_logging as measure, describe_environment, describe_logging  # noqa: PLC0415

    env = _bench_setup(recipe, overrides)
    result = measure(steps, size, repeats)
    if as_json:
        click.echo(json.dumps({**env, "repeats": repeats, **result.to_dict()}, indent=2))
    else:
        click.echo(describe_environment(env))
        click.echo(describe_logging(result))



@bench.command("devices", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_device_option
@click.option("--size", type=_SIZE, default=2048, show_default=True, help="Matrix side n (float32).")
@_repeats_option
@_bench_json_option
@handle_errors
def bench_devices(recipe: str | None, overrides: tuple[str, ...], size: int, repeats: int, as_json: bool) -> None:
    """Same matmuls on one device vs split across all.

    Independent float32 (SIZE, SIZE) matmul chains, one per device (at least
    two), run in sequence on the first device, then one per device launched
    together. Uses the logical GPUs if there are any, else the logical CPUs; split one
    with --set devices.cpu_logical_devices=2 (or devices.gpu_logical_devices).
    """
    from ..devices.bench import bench_devices as measure, describe_devices, describe_environment  # noqa: PLC0415

    env = _bench_setup(recipe, overrides)
    result = measure(size, repeats)
    if as_json:
        click.echo(json.dumps({**env, "repeats": repeats, **result.to_dict()}, indent=2))
    else:
        click.echo(describe_environment(env))
        click.echo(describe_devices(result))



@bench.command("input", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@set_device_option
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True,
              help="Batches timed in each measurement (at most an epoch's).")
@_bench_json_option
@handle_errors
def bench_input(recipe: str | None, overrides: tuple[str, ...], steps: int, as_json: bool) -> None:
    """The input pipeline alone vs the model's step: is training input-bound?

    Times RECIPE's training pipeline with no model (its first pass, which
    decodes and fills a cache, and its second, what later epochs cost) and
    the model's step, by the recipe's own loop and strategy, on one batch
    staged in memory. Prints both in samples/s and the verdict: the share of
    training time input would take (with GPUs: 1 - pipeline/step when the
    pipeline is slower; on CPUs, whose cores both share: step / (pipeline +
    step)), input-bound at 10 % or more, with the recipe keys that feed the
    step faster.
    """
    from ..training.input_bench import bench_input as measure, describe  # noqa: PLC0415

    result = measure(recipe, overrides, steps)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else describe(result))
