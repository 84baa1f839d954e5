"""A script that calls tfgpu.setup() itself: under tfgpu launch it returns what the bootstrap applied."""
import tfgpu
from tfgpu.devices import setup as setup_module

applied = setup_module._applied[1] if setup_module._applied else None
info = tfgpu.setup()
print("same", info is applied)
print("replicas", info.num_replicas, "logical", len(info.logical_devices))
