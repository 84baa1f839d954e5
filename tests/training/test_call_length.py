"""How long one training call runs: stop signals, `every_steps` saves, `progress.json` and the
progress bar act only between calls, so a call must stay short whatever the epoch's length
(issue 21, fault 3: a prime step count once made the whole epoch one call).

The plan bounds the steps per call, whatever the epoch's factors (issue 35: fit's calls had to
divide the epoch, so 178 steps ran 2 a call and a prime count 1); an epoch's last call runs the
steps left, in both loops; the custom loop also times its calls and shortens them; fit, whose
calls tfgpu cannot shorten at run time, warns.
"""

from __future__ import annotations

import json

import pytest

from tfgpu.training.loops.custom import MAX_CALL_SECONDS, next_steps_per_call
from tfgpu.training.loops.fit import fit_calls
from tfgpu.training.trainer import AUTO_STEPS_PER_EXECUTION, profile_calls, resolve_steps_per_execution

from ..conftest import run_python


@pytest.mark.parametrize("steps", [6, 89, 96, 178, 356, 997, 10006, 10007])
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_auto_never_runs_more_than_the_documented_steps_per_call(steps, loop):
    per_call, reason = resolve_steps_per_execution("auto", steps, loop)
    assert per_call == min(32, steps) == min(AUTO_STEPS_PER_EXECUTION, steps)  # the last call runs the steps left
    assert sum(fit_calls(steps, per_call)) == steps and max(fit_calls(steps, per_call)) == per_call
    assert (f"a call over {MAX_CALL_SECONDS:g} s is shortened" in reason) == (loop == "custom")
    assert reason.startswith("auto: ")
    # Keras's fit on JAX still needs calls that divide the epoch (tfgpu does not replace its train function there)
    on_jax, why = resolve_steps_per_execution("auto", steps, "fit", "jax")
    assert steps % on_jax == 0 and on_jax <= 32 and ("largest divisor" in why or on_jax == steps)


@pytest.mark.parametrize("setting, steps, loop, expected, said", [
    ("auto", 997, "fit", 32, "at most 32 steps a call (an epoch's last call: 5)"),        # prime
    ("auto", 997, "custom", 32, "at most 32 steps a call (an epoch's last call: 5)"),
    ("auto", 10006, "fit", 32, "at most 32 steps a call (an epoch's last call: 22)"),     # 2 x 5003
    ("auto", 6, "fit", 6, "the whole 6-step epoch in one call"),
    (5, 178, "fit", 5, "train.steps_per_execution: 5: at most 5 steps a call (an epoch's last call: 3)"),
    (5, 178, "custom", 5, "train.steps_per_execution: 5: at most 5 steps a call (an epoch's last call: 3)"),
    (100, 997, "custom", 100, "at most 100 steps"),   # an explicit number is honoured, never rounded up
    (500, 178, "fit", 178, "the whole 178-step epoch in one call"),
])
def test_steps_per_call_and_the_reason_recorded(setting, steps, loop, expected, said):
    per_call, reason = resolve_steps_per_execution(setting, steps, loop)
    assert per_call == expected and said in reason


@pytest.mark.parametrize("steps, per_call, calls", [
    (178, 32, [32, 32, 32, 32, 32, 18]), (89, 32, [32, 32, 25]), (96, 32, [32, 32, 32]), (5, 32, [5]),
    (37, 8, [8, 8, 8, 8, 5]), (1, 1, [1]),
])
def test_fit_calls_cover_the_epoch_once_and_never_exceed_the_bound(steps, per_call, calls):
    assert fit_calls(steps, per_call) == calls


def test_profiled_calls_follow_the_custom_loops_shorter_last_call():
    # 10 steps an epoch in calls of 4: calls 1-3 are steps 1-4, 5-8, 9-10; call 4 is steps 11-14.
    assert profile_calls([11, 12], 3, 10, 4) == {"steps_asked": [11, 12], "calls": [4, 4], "steps": [11, 14]}
    assert profile_calls([9, 10], 3, 10, 4)["steps"] == [9, 10]
    assert profile_calls([2, 3], 2, 12, 2) == {"steps_asked": [2, 3], "calls": [1, 2], "steps": [1, 4]}


@pytest.mark.parametrize("cap, steps, seconds, most, expected", [
    (32, 32, 12.8, 32, 6),    # 0.4 s a step: 6 steps take 2.4 s, half the 5 s bound
    (32, 32, 600.0, 32, 1),   # never fewer than one step
    (6, 6, 0.1, 32, 12),      # fast again: doubled while that still takes at most half the bound
    (16, 16, 0.1, 32, 32),
    (32, 5, 0.01, 32, 32),    # an epoch's short last call changes nothing
    (8, 8, 3.0, 32, 8),       # under the bound, and doubling would exceed half of it
])
def test_next_call_is_shortened_over_the_bound_and_grows_back(cap, steps, seconds, most, expected):
    assert next_steps_per_call(cap, steps, seconds, most, bound=5.0) == expected


CUSTOM = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
import keras
from tfgpu.training.loops import Job
from tfgpu.training.loops.custom import train_custom

x = np.random.default_rng(0).normal(size=(160, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)   # 20 batches an epoch

class Ends(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []
    def on_epoch_begin(self, epoch, logs=None):
        self.ends.append([])
    def on_train_batch_end(self, batch, logs=None):
        self.ends[-1].append(batch)

out = {}
for name, bound in (("roomy", 1e9), ("tight", 1e-9)):
    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01)
    job = Job(model=model, train_epochs=lambda epochs, skip: data.repeat(epochs).skip(skip), validation=None,
              epochs=2, steps_per_epoch=20, strategy=strategy, optimizer=optimizer,
              loss=keras.losses.MeanSquaredError(reduction=None), steps_per_execution=8)
    ends = Ends()
    print("RUN", name, flush=True)
    traces = train_custom(job, [ends], "none", max_call_seconds=bound)
    out[name] = {"ends": ends.ends, "traces": traces, "steps": int(optimizer.iterations.numpy())}
print("OUT", json.dumps(out))
"""


@pytest.mark.slow
def test_custom_loop_shortens_calls_over_the_bound_without_retracing():
    """The custom loop shortens its calls over the bound, without retracing, and warns once.
    Trains its own models: the call-time bound under test changes how the custom loop trains."""
    result = run_python(CUSTOM)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.split("OUT", 1)[1])
    # Under the bound: calls of 8 steps, the epoch's last one 4, the same every epoch.
    assert runs["roomy"]["ends"] == [[7, 15, 19], [7, 15, 19]]
    # Over it: the first call traces (not counted); the second is timed, and every later call runs one step.
    assert runs["tight"]["ends"] == [[7, 15, 16, 17, 18, 19], list(range(20))]
    for run in runs.values():
        assert run["traces"] == {"train": 1, "validation": 0} and run["steps"] == 40  # epochs stay exact
    roomy, tight = result.stdout.split("RUN tight")
    assert "warning" not in roomy
    assert tight.count("tfgpu: warning: a training call of 8 steps took") == 1
    assert "(stop signals and checkpoints wait for the call to end): calls now run at most 1 step\n" in tight


EVERY_SAMPLE = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfgpu.training.loops import Job
from tfgpu.training.loops.custom import train_custom
from tfgpu.training.loops.replica_batches import Feed
from tfgpu.training.loops.fit import train_fit

class Seen(keras.layers.Layer):
    # counts, per sample id (its input), how often a training step saw it, summed over the replicas
    def __init__(self, n):
        super().__init__()
        self.n = n
        self.seen = tf.Variable(tf.zeros(n), trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                                aggregation=tf.VariableAggregation.SUM)
    def call(self, x, training=False):
        if training:
            ids = tf.cast(x[:, 0], tf.int32)
            self.seen.assign_add(tf.math.bincount(ids, minlength=self.n, maxlength=self.n, dtype=tf.float32))
        return x

class Record(keras.callbacks.Callback):
    def __init__(self, seen, optimizer):
        super().__init__()
        self.layer, self.optimizer, self.ends, self.calls, self.counts = seen, optimizer, [], [], []
    def on_epoch_begin(self, epoch, logs=None):
        self.ends.append([])
        self.calls.append([])
        self.before = int(self.optimizer.iterations.numpy())
    def on_train_batch_end(self, batch, logs=None):
        now = int(self.optimizer.iterations.numpy())
        self.ends[-1].append(batch)
        self.calls[-1].append(now - self.before)
        self.before = now
    def on_epoch_end(self, epoch, logs=None):
        self.counts.append(sorted(set(self.layer.seen.numpy().tolist())))

out = {"runs": {}, "splits": {}}
for replicas in (1, 2):
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    for steps in (37, 32, 21, 5):     # a prime, a power of two, odd, fewer than a call's 8
        n = steps * 4 - 1             # global batches of 4, the last one of 3 (2 rows and 1 on two replicas)
        x = np.arange(n, dtype="float32")[:, None]
        data = tf.data.Dataset.from_tensor_slices((x, np.zeros((n, 1), "float32"))).batch(4)
        for loop in ("fit", "custom"):
            with strategy.scope():
                seen = Seen(n)
                model = keras.Sequential([keras.Input((1,)), seen, keras.layers.Dense(1)])
                optimizer = keras.optimizers.SGD(0.01)
                model.compile(optimizer, "mse", steps_per_execution=8)
            record = Record(seen, optimizer)
            job = Job(model=model, train_epochs=lambda epochs, skip: data.repeat(epochs).skip(skip), validation=None,
                      epochs=2, steps_per_epoch=steps, strategy=strategy, optimizer=optimizer,
                      loss=keras.losses.MeanSquaredError(reduction=None), steps_per_execution=8,
                      terminate_on_nan=False)
            (train_fit if loop == "fit" else train_custom)(job, [record], "none", max_call_seconds=1e9)
            out["runs"][f"{loop} {replicas} {steps}"] = {"ends": record.ends, "calls": record.calls,
                                                         "counts": record.counts,
                                                         "plain": Feed.of(strategy).plain}
    # each replica's rows of a global batch: tfgpu's plain feed against tf.distribute's own split
    for rows in (1, 2, 3, 4, 7):
        batch = tf.data.Dataset.range(rows).batch(rows)
        theirs = next(iter(strategy.experimental_distribute_dataset(batch)))
        ours = tf.function(lambda b: Feed(strategy, True).args((b,)))(next(iter(batch)))[0]
        out["splits"][f"{replicas} {rows}"] = [[t.numpy().tolist() for t in strategy.experimental_local_results(v)]
                                               for v in (theirs, ours)]

# fit cannot shorten a call at run time: it says so once, and what to change
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=37)
data = tf.data.Dataset.from_tensor_slices((np.zeros((296, 1), "float32"), np.zeros((296, 1), "float32"))).batch(8)
job = Job(model=model, train_epochs=lambda epochs, skip: data.repeat(epochs).skip(skip), validation=None,
          epochs=2, steps_per_epoch=37, terminate_on_nan=False)
print("RUN tight", flush=True)
train_fit(job, [], "none", max_call_seconds=1e-9)
print("OUT", json.dumps(out))
"""


@pytest.mark.slow
def test_every_sample_once_an_epoch_in_calls_never_over_the_bound():
    """Both loops, 1 and 2 replicas (logical CPUs), 8 steps a call, epochs of a prime, a power of two, an odd
    number of steps and fewer than one call: each epoch trains every sample exactly once (counted by a layer
    inside the model, summed over the replicas), in calls of at most 8 steps, the last call the steps left.
    Trains its own tiny models: the steps per call and the step counts are what is under test."""
    result = run_python(EVERY_SAMPLE)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("OUT", 1)[1])
    for name, run in out["runs"].items():
        loop, replicas, steps = name.split()
        calls = fit_calls(int(steps), 8)
        assert run["calls"] == [calls, calls], name             # steps each call ran (the optimizer's count)
        ends = [sum(calls[:i + 1]) - 1 for i in range(len(calls))]
        assert run["ends"] == [ends, ends], name                # the batch index the callbacks were given
        assert run["counts"] == [[1.0], [2.0]], name            # every sample once in epoch 1, twice by epoch 2
        assert run["plain"] is True                             # CPU replicas: tfgpu's plain feed under test
    assert len(out["runs"]) == 16
    for name, (theirs, ours) in out["splits"].items():
        assert ours == theirs, name                             # e.g. 3 rows on 2 replicas: [0, 1] and [2]
    assert out["splits"]["2 3"][1] == [[0, 1], [2]] and out["splits"]["2 1"][1] == [[0], []]
    assert "Your input ran out of data" not in result.stderr
    before, tight = result.stdout.split("RUN tight")
    assert "warning" not in before
    assert tight.count("tfgpu: warning: a training call of 37 steps took") == 1
    assert "lower train.steps_per_execution, or use train.loop: custom" in tight
