"""Child process of :func:`tfgpu.devices.probe.probe_jax`: start JAX (and Keras on it), print one JSON line.

Reads a JSON request on stdin: ``{"config": {...} or null}``. With a config,
its JAX plan (:func:`tfgpu.devices.plan.make_plan` for this machine's
:func:`tfgpu.devices.probe.probe`) sets the environment before JAX is imported, so
the devices listed are those a run gets; :func:`tfgpu.setup` is not called.
Without one, ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` is set so listing the
GPUs takes none of their memory (JAX takes 75% of each GPU when its backend
starts otherwise: https://docs.jax.dev/en/latest/gpu_memory_allocation.html).
TensorFlow is never imported. Run as ``python -m tfgpu.devices.seen_by_jax`` (the parent
sets ``KERAS_BACKEND=jax``); not part of the public API.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _apply_plan(config: Any) -> dict[str, Any]:
    """Set the config's JAX environment; ``{"setup_error": ...}`` when it cannot be planned."""
    from ..config import load_config  # noqa: PLC0415
    from ..errors import TfgpuError  # noqa: PLC0415
    from .plan import make_plan  # noqa: PLC0415
    from .probe import probe  # noqa: PLC0415

    try:
        plan = make_plan(load_config(config), probe())
    except TfgpuError as exc:
        return {"setup_error": str(exc)}
    os.environ.update(plan.env)
    return {}


def _facts(config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config is not None:
        out.update(_apply_plan(config))
    if config is None or "setup_error" in out:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # listing the devices takes no GPU memory
    os.environ["KERAS_BACKEND"] = "jax"
    try:
        import jax  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        out["import_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["version"] = jax.__version__
    try:
        import jaxlib  # noqa: PLC0415

        out["jaxlib_version"] = jaxlib.__version__
    except Exception as exc:  # noqa: BLE001 - jax imports jaxlib: this is unlikely, and then the finding
        out["import_error"] = f"jaxlib: {type(exc).__name__}: {exc}"
    try:
        out["devices"] = [[f"{d.platform}:{d.id}", d.platform, str(d.device_kind)] for d in jax.devices()]
        out["default_backend"] = jax.default_backend()
    except Exception as exc:  # noqa: BLE001 - e.g. JAX_PLATFORMS names a platform with no plugin
        out["import_error"] = f"jax.devices(): {type(exc).__name__}: {exc}"
        return out
    try:
        import keras  # noqa: PLC0415

        out["keras_version"] = keras.__version__
        if keras.config.backend() != "jax":
            out["import_error"] = (f"keras: runs on {keras.config.backend()!r}, not on JAX, although "
                                   "KERAS_BACKEND=jax (a Keras 2 or tf-keras installed as keras?)")
    except Exception as exc:  # noqa: BLE001
        out["import_error"] = f"keras: {type(exc).__name__}: {exc}"
    return out


def main() -> None:
    text = sys.stdin.read().strip()
    request = json.loads(text) if text else {}
    print(json.dumps(_facts(request.get("config")), default=str), flush=True)


if __name__ == "__main__":
    main()
