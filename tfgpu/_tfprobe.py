"""Child process of :func:`tfgpu.probe.probe_tensorflow`: start TensorFlow, print one JSON line.

Reads an optional config (JSON) on stdin and applies it with :func:`tfgpu.setup`
first. Run as ``python -m tfgpu._tfprobe``; not part of the public API.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _facts(config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config is not None:
        import tfgpu  # noqa: PLC0415

        try:
            tfgpu.setup(config)
        except tfgpu.TfgpuError as exc:
            out["setup_error"] = str(exc)
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
    out["logical_devices"] = [[d.name, d.device_type] for d in tf.config.list_logical_devices()]
    return out


def main() -> None:
    text = sys.stdin.read().strip()
    config = json.loads(text) if text else None
    print(json.dumps(_facts(config), default=str), flush=True)


if __name__ == "__main__":
    main()
