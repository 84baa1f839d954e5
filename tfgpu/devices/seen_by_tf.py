"""Child process of :func:`tfgpu.devices.probe.probe_tensorflow`: start TensorFlow, print one JSON line.

Reads a JSON request on stdin: ``{"config": {...} or null, "logical": bool}``.
With a config, it is applied with :func:`tfgpu.setup` first. ``logical``
lists the logical devices, which initialises the GPUs: memory growth is turned
on first (unless the config decides), so the probe never takes a GPU's memory
from a job running beside it. Without ``logical`` only physical devices are
listed, which creates no CUDA context (what ``tfgpu doctor`` and the image's
health check use). Run as ``python -m tfgpu.devices.seen_by_tf``; not part of the public API.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _facts(config: Any, logical: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config is not None:
        from ..errors import TfgpuError  # noqa: PLC0415
        from .setup import setup  # noqa: PLC0415

        try:
            setup(config)
        except TfgpuError as exc:
            out["setup_error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - setup() imports TensorFlow: its failure is the finding
            out["import_error"] = f"{type(exc).__name__}: {exc}"
            return out
    try:
        import tensorflow as tf  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        out["import_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["version"] = tf.__version__
    try:
        import keras  # noqa: PLC0415

        out["keras_version"] = keras.__version__
    except Exception as exc:  # noqa: BLE001
        out["keras_version"] = None
        out["import_error"] = f"keras: {type(exc).__name__}: {exc}"
    out["build_info"] = {k: v if isinstance(v, (str, int, float, bool, list)) else str(v)
                         for k, v in dict(tf.sysconfig.get_build_info()).items()}
    physical = tf.config.list_physical_devices()
    out["physical_devices"] = [[d.name, d.device_type] for d in physical]
    details = []
    for d in physical:
        if d.device_type == "GPU":
            info = tf.config.experimental.get_device_details(d)
            details.append({k: list(v) if isinstance(v, tuple) else v for k, v in info.items()})
    out["gpu_details"] = details
    if logical:
        if config is None:
            for d in physical:
                if d.device_type == "GPU":
                    tf.config.experimental.set_memory_growth(d, True)
        out["logical_devices"] = [[d.name, d.device_type] for d in tf.config.list_logical_devices()]
    return out


def main() -> None:
    text = sys.stdin.read().strip()
    request = json.loads(text) if text else {}
    print(json.dumps(_facts(request.get("config"), bool(request.get("logical"))), default=str), flush=True)


if __name__ == "__main__":
    main()
