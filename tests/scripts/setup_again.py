"""A script that calls tfgpu.setup() itself: under tfgpu launch it returns what the bootstrap applied."""
import tfgpu

applied = tfgpu._applied[1] if tfgpu._applied else None
info = tfgpu.setup()
print("same", info is applied)
print("replicas", info.num_replicas, "logical", len(info.logical_devices))
