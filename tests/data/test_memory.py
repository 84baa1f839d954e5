"""What the in-memory data path really holds, and how much memory a worker may decode data into.

Peak RSS is read in a fresh interpreter (``VmHWM`` in ``/proc/self/status``,
reset to the current RSS through ``/proc/self/clear_refs``); the memory
available is faked only at its seam, :func:`tfgpu.data.pipeline.available_bytes`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfgpu.cluster.spec import Cluster, local_cluster
from tfgpu.data import workers_on_host
from tfgpu.data.pipeline import MEMORY_FRACTION, memory_allowance

from ..conftest import data_dir, run_python

#: Peak RSS (above the baseline) over the bytes the budget counts, at most, for MNIST loaded in
#: memory, its pipelines built and one pass of each read (batch 128). Measured on 2 cores, TF 2.21:
#: 1.13-1.34 (27.9-33.0 MiB for 24.65 MiB counted); the package before this factor was checked
#: (commit 48ff794, run from a temporary copy) reached 3.3-3.6 (81.8-88.6 MiB): ``tf.constant``
#: copied the training images (twice over, their buffer being unaligned), tf.data's graph rewrite
#: copied them again, and the validation images were copied by ``from_tensor_slices`` and cached
#: as float32 (4 bytes for each 1-byte pixel). With another xdist worker training beside it, 1.64 was seen
#: once (40.4 MiB: tf.data's threads run ahead of a slowed reader), hence 1.8, still half the unfixed factor.
HELD_FACTOR = 1.8

PEAK = """
    import json, os, sys
    import tensorflow as tf
    from tfgpu.config import load_config
    from tfgpu.data import LoadContext, prepare, source_for
    from tfgpu.data.pipeline import held_bytes

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    def one_pass(sets):
        cfg = load_config("recipes/mnist.yaml", sets)
        source = source_for(cfg.data, cfg.model.loss, cfg.tensorflow.seed)
        source.check()
        data, pipes = prepare(source, cfg.data, LoadContext(global_batch_size=128, num_replicas=1, seed=42))
        for dataset in (pipes.train, pipes.validation, pipes.validation):
            for x, y in dataset:
                pass
        return data, pipes

    one_pass(["data.path=" + sys.argv[1]])  # the same steps on 3,072 digits first: threads, functions, buffers
    base = status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
    except OSError as exc:
        print("NO_CLEAR_REFS", exc)
        sys.exit(0)
    data, pipes = one_pass([])
    peak = status("VmHWM") - base
    counted = sum(held_bytes(data.spec, s.size, s.name == "train") for s in data.splits())
    print("PEAK", json.dumps({"peak_mib": peak / 2**20, "counted_mib": counted / 2**20, "cache": pipes.info["cache"]}))
"""


@pytest.mark.slow
def test_mnist_in_memory_peaks_near_the_bytes_the_budget_counts(tmp_path):
    small = tmp_path / "mnist_small.npz"
    with np.load(data_dir() / "mnist" / "mnist.npz") as d:
        np.savez(small, x_train=d["x_train"][:2048], y_train=d["y_train"][:2048], x_test=d["x_test"][:1024],
                 y_test=d["y_test"][:1024])
    result = run_python(f"import sys; sys.argv[1:] = [{str(small)!r}]\n" + PEAK.replace("\n    ", "\n"),
                        TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    if "NO_CLEAR_REFS" in result.stdout:
        pytest.skip(f"the peak RSS cannot be reset here: {result.stdout.strip()}")
    figures = json.loads(result.stdout.split("PEAK", 1)[1])
    # 22,699 + 10,000 digits of 784 bytes and a 1-byte label, and the training digits' 8 bytes of
    # shuffled indices: 25,850,307 bytes
    assert figures["counted_mib"] == pytest.approx(24.65, abs=0.01)
    assert figures["cache"] == {"train": "memory (read before training: 17.2 MiB)",
                                "validation": "memory (read before training: 7.5 MiB)"}
    assert figures["peak_mib"] <= HELD_FACTOR * figures["counted_mib"], figures


def test_workers_on_one_host_share_the_memory_budget():
    available = 8 * 2**30
    two_here = local_cluster([23456, 23457], 1)  # tfgpu run --workers 2
    assert workers_on_host(two_here) == 2
    assert memory_allowance(available, workers_on_host(two_here)) == MEMORY_FRACTION * available / 2
    apart = Cluster({"worker": ("node1:2222", "node2:2222")}, "worker", 1, "TF_CONFIG")
    assert workers_on_host(apart) == 1
    assert memory_allowance(available, workers_on_host(apart)) == MEMORY_FRACTION * available
    slurm = Cluster({"worker": ("n01:2222", "n01:2223", "n02:2222", "n02:2223")}, "worker", 2, "Slurm")
    assert workers_on_host(slurm) == 2  # two tasks a node
    chief = Cluster({"chief": ("localhost:2000",), "worker": ("127.0.0.1:2001", "gpu7:2000")}, "worker", 0,
                    "TF_CONFIG")
    assert workers_on_host(chief) == 2  # the chief counts; loopback names are one host
    assert workers_on_host(Cluster({"worker": ("localhost",)})) == 1 and workers_on_host(None) == 1
    assert memory_allowance(None, 4) is None  # unknown memory: no limit


@pytest.fixture(scope="module")
def digits_png(tmp_path_factory):
    """The first 1,000 real MNIST digits of each split as PNG class folders."""
    from recipes.make_examples import write_png_folder  # noqa: PLC0415

    return write_png_folder(tmp_path_factory.mktemp("digits_png"), limit=1000)


@pytest.mark.slow
def test_a_split_that_fits_one_worker_is_streamed_by_four_on_one_host(digits_png):
    # 1,000 digits of 784 bytes and int32 labels: 788,000 bytes a split (796,000 for training, with its
    # indices), on one worker; with several, auto-sharding copies the arrays: 1,576,000 (1,584,000).
    # Half of 8,000,000 bytes is 4,000,000 for one worker, 2,000,000 each for two on one host, 1,000,000
    # each for four on one host, 4,000,000 each for four on four hosts.
    result = run_python(f"""
        import json
        from types import SimpleNamespace
        import tfgpu.data.pipeline as pipeline
        pipeline.available_bytes = lambda: 8_000_000  # the seam: MemAvailable
        from tfgpu.cluster.spec import Cluster, local_cluster
        from tfgpu.config import load_config
        from tfgpu.data import load, source_for
        cfg = load_config({{"data": {{"kind": "image_folder", "path": {str(digits_png / 'train')!r},
                                    "test_path": {str(digits_png / 'test')!r}}}}})
        apart = Cluster({{"worker": tuple(f"node{{i}}:2222" for i in range(4))}}, "worker", 0, "TF_CONFIG")
        for name, cluster in (("one", None), ("two here", local_cluster([23456, 23457], 0)),
                              ("four here", local_cluster([23456, 23457, 23458, 23459], 3)),
                              ("four apart", apart)):
            info = SimpleNamespace(cluster=cluster, global_batch_size=100, num_replicas=1, backend="tensorflow")
            source = source_for(cfg.data)
            source.check()
            data, pipes = load(cfg, info, source)
            x, y = next(iter(pipes.train))
            print("RUN", json.dumps({{"name": name, "memory": [s.in_memory for s in data.splits()],
                                     "cache": pipes.info["cache"], "batch": list(x.shape)}}))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {r["name"]: r for r in (json.loads(line[4:]) for line in result.stdout.splitlines()
                                  if line.startswith("RUN "))}
    assert runs["one"]["memory"] == [True, True] and runs["four apart"]["memory"] == [True, True]
    assert runs["one"]["cache"]["validation"] == "memory (decoded once before training: 0.8 MiB)"
    assert runs["two here"]["memory"] == [True, False]
    assert runs["two here"]["cache"]["validation"] == (
        "none: decoded it would take 1.5 MiB; half of the 7.6 MiB available, shared by the 2 workers on this "
        "host, leaves 0.4 MiB for it; set data.cache to a folder to cache on disk")
    assert runs["four here"]["memory"] == [False, False]
    assert runs["four here"]["cache"]["train"] == (
        "none: decoded it would take 1.5 MiB; half of the 7.6 MiB available, shared by the 4 workers on this "
        "host, leaves 1.0 MiB for it; set data.cache to a folder to cache on disk")
    assert all(r["batch"] == [100, 28, 28, 1] for r in runs.values())


@pytest.mark.slow
def test_a_builders_float32_batches_are_cached_only_when_they_fit(tmp_path):
    # 2,000 validation digits as float32 (3,136 bytes) with int32 labels: 6,280,000 bytes once cached.
    (tmp_path / "digit_batches.py").write_text(f"""
import numpy as np
import tensorflow as tf

def build(global_batch_size):
    with np.load({str(data_dir() / 'mnist' / 'mnist.npz')!r}) as d:
        x, y = d["x_test"][:3000], d["y_test"][:3000].astype("int32")
    train = tf.data.Dataset.from_tensor_slices((x[:1000], y[:1000])).batch(global_batch_size)
    return train, tf.data.Dataset.from_tensor_slices((x[1000:], y[1000:])).batch(global_batch_size)
""")
    result = run_python(f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np
        import tfgpu.data.pipeline as pipeline
        from tfgpu.config import load_config
        from tfgpu.data import LoadContext, prepare, source_for
        cfg = load_config({{"data": {{"kind": "builder", "builder": "digit_batches:build", "batched": True,
                                    "num_classes": 10}}}})
        for available in (2**30, 8 * 2**20):
            pipeline.available_bytes = lambda: available  # the seam: MemAvailable
            source = source_for(cfg.data)
            source.check()
            data, pipes = prepare(source, cfg.data, LoadContext(global_batch_size=100, num_replicas=1))
            passes = [np.concatenate([y.numpy() for _, y in pipes.validation]) for _ in range(2)]
            print("RUN", json.dumps({{"cache": pipes.info["cache"]["validation"], "samples": len(passes[0]),
                                     "same": bool((passes[0] == passes[1]).all())}}))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    fits, streamed = (json.loads(line[4:]) for line in result.stdout.splitlines() if line.startswith("RUN "))
    assert fits["cache"] == "memory (float32 batches cached in the first epoch: at most 6.0 MiB)"
    assert streamed["cache"] == ("none: cached as float32 batches it would take 6.0 MiB; half of the 8.0 MiB "
                                 "available leaves 4.0 MiB for it; read from the builder every epoch")
    assert fits["samples"] == streamed["samples"] == 2000 and fits["same"] and streamed["same"]


@pytest.mark.slow
def test_each_epoch_is_a_seeded_permutation_and_a_resumed_run_reads_the_same_batches(tmp_path):
    # The samples' targets are their numbers (a regression on real digits), so each batch names its samples.
    with np.load(data_dir() / "mnist" / "mnist.npz") as d:
        np.savez(tmp_path / "numbered.npz", x_train=d["x_train"][:1000], y_train=np.arange(1000, dtype=np.float32))
    result = run_python(f"""
        import json
        import numpy as np
        from tfgpu.config import load_config
        from tfgpu.data import LoadContext, prepare, source_for

        def pipelines(seed, **data):
            cfg = load_config({{"data": {{"kind": "arrays", "path": {str(tmp_path / 'numbered.npz')!r}, **data}},
                               "model": {{"loss": "mse"}}}})
            source = source_for(cfg.data, cfg.model.loss)
            source.check()
            return prepare(source, cfg.data, LoadContext(global_batch_size=64, num_replicas=1, seed=seed))[1]

        def batches(ds):
            return [y.numpy().astype(int).tolist() for _, y in ds]

        import tensorflow as tf
        from tfgpu.training.loops.replica_batches import Blocks, block_steps, steps_function

        def in_blocks(pipes, skip, block, calls):
            # what a loop's steps see, reading blocks in calls of these lengths (a shortened call, a call that
            # ends inside a block, a call longer than a block); each step writes its targets into the next row
            # of a variable, in the order its updates run, as a training step updates its weights
            left = 3 * pipes.steps_per_epoch - skip
            rows, at = tf.Variable(tf.fill([left, pipes.global_batch], -1.0)), tf.Variable(0)

            def record(batch):
                y = batch[1]
                rows[at.assign_add(1) - 1].assign(tf.pad(y, [[0, pipes.global_batch - tf.shape(y)[0]]],
                                                         constant_values=-1.0))

            source = Blocks(pipes.train_epochs(3, skip, block=block), pipes.global_batch)
            several, done = steps_function(record, source), 0
            for n in calls * left:
                if done < left:
                    several(source, tf.constant(min(n, left - done)))
                    done += min(n, left - done)
            seen = [[int(v) for v in row if v >= 0] for row in rows.numpy()]
            return seen, several.experimental_get_tracing_count()

        pipes = pipelines(7)
        whole = batches(pipes.train_epochs(3))
        spec = pipes.train.element_spec  # 28 x 28 float32 images and float32 targets: 3,140 bytes a sample
        print("RUN", json.dumps({{
            "steps": pipes.steps_per_epoch, "whole": whole,
            "resumed": {{k: batches(pipes.train_epochs(3, k)) for k in (5, 16, 21)}},
            "again": batches(pipelines(7).train_epochs(1)), "other": batches(pipelines(8).train_epochs(1)),
            "window": batches(pipelines(7, shuffle_buffer=100).train_epochs(1)),
            "blocks": [pipes.train_blocks, pipelines(7, shuffle_buffer=100).train_blocks],
            "block_rows": [len(b) for b in batches(pipes.train_epochs(1, 3, block=5))],
            "in_blocks": in_blocks(pipes, 0, 5, [7, 3, 32, 1, 5]),
            "resumed_in_blocks": in_blocks(pipes, 21, 4, [6, 2]),
            "block_steps": [block_steps(spec, 64, 32), block_steps(spec, 64, 8),
                            block_steps(spec, 64, 32, 64 * 3140 * 3), block_steps(spec, 64, 32, 1000)]}}))
    """, TF_CPP_MIN_LOG_LEVEL="3")
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads(result.stdout.split("RUN ", 1)[1])
    steps, whole = run["steps"], run["whole"]
    assert steps == 16 and len(whole) == 48 and [len(b) for b in whole[:16]] == [64] * 15 + [40]
    epochs = [sum(whole[e * steps:(e + 1) * steps], []) for e in range(3)]
    assert all(sorted(e) == list(range(1000)) for e in epochs)  # every sample once an epoch
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != list(range(1000))  # reshuffled every epoch
    assert all(run["resumed"][str(k)] == whole[k:] for k in (5, 16, 21))  # skipping reads what follows
    assert run["again"] == whole[:16] and run["other"] != whole[:16]  # the seed decides the order
    assert sorted(sum(run["window"], [])) == list(range(1000))  # a smaller shuffle_buffer: still each once
    # Blocks (CPU replicas, in memory: a call's batches gathered at once) hold whole batches, an epoch's last block
    # the rest of it; the steps see the very batches above, whatever the calls' lengths, resumed too, in one trace
    assert run["blocks"] == [True, False]  # a shuffle window has no whole permutation to cut into blocks
    assert run["block_rows"] == [320, 320, 168]  # from batch 3: batches 3-7, 8-12, then 13-15 (64 + 64 + 40 rows)
    assert run["in_blocks"] == [whole, 1] and run["resumed_in_blocks"] == [whole[21:], 1]
    assert run["block_steps"] == [32, 8, 3, 1]  # the most a call runs, the bytes allowed, at least one
