"""How long one training call runs: stop signals, `every_steps` saves, `progress.json` and the
progress bar act only between calls, so a call must stay short whatever the epoch's length
(issue 21, fault 3: a prime step count once made the whole epoch one call).

The plan bounds the steps per call; the custom loop also times its calls and shortens them;
fit, whose steps per call Keras fixes when the model is compiled, warns.
"""

from __future__ import annotations

import json

import pytest

from tfgpu.training.loops.custom import MAX_CALL_SECONDS, next_steps_per_call
from tfgpu.training.trainer import AUTO_STEPS_PER_EXECUTION, profile_calls, resolve_steps_per_execution

from ..conftest import run_python


@pytest.mark.parametrize("steps", [6, 89, 96, 178, 356, 997, 10006, 10007])
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_auto_never_runs_more_than_the_documented_steps_per_call(steps, loop):
    per_call, reason = resolve_steps_per_execution("auto", steps, loop)
    assert 1 <= per_call <= AUTO_STEPS_PER_EXECUTION == 32
    if loop == "fit":
        assert steps % per_call == 0  # Keras's fit runs whole calls: the epoch stays one exact pass
    else:
        assert per_call == min(32, steps)  # the last call of an epoch runs the steps left
        assert f"a call over {MAX_CALL_SECONDS:g} s is shortened" in reason
    assert reason.startswith("auto: ")


@pytest.mark.parametrize("setting, steps, loop, expected, said", [
    ("auto", 997, "fit", 1, "the largest divisor of the epoch's 997 steps up to 32"),   # prime
    ("auto", 997, "custom", 32, "at most 32 steps a call (an epoch's last call: 5)"),
    ("auto", 10007, "fit", 1, "largest divisor"),                                        # prime
    ("auto", 10006, "fit", 2, "largest divisor"),                                        # 2 x 5003
    ("auto", 10006, "custom", 32, "at most 32 steps"),
    ("auto", 6, "fit", 6, "the whole 6-step epoch in one call"),
    (5, 178, "fit", 2, "train.steps_per_execution: 5: the largest divisor of the epoch's 178 steps up to 5"),
    (5, 178, "custom", 5, "train.steps_per_execution: 5: at most 5 steps a call (an epoch's last call: 3)"),
    (100, 997, "custom", 100, "at most 100 steps"),   # an explicit number is honoured, never rounded up
    (500, 178, "fit", 178, "the whole 178-step epoch in one call"),
])
def test_steps_per_call_and_the_reason_recorded(setting, steps, loop, expected, said):
    per_call, reason = resolve_steps_per_execution(setting, steps, loop)
    assert per_call == expected and said in reason


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


FIT = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
import keras
from tfgpu.training.loops import Job
from tfgpu.training.loops.fit import train_fit
from tfgpu.training.trainer import resolve_steps_per_execution

x = np.random.default_rng(0).normal(size=(296, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)   # 37 batches an epoch: a prime

class Ends(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []
    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(batch)

out = {}
for name, per_call, bound in (("tfgpu", resolve_steps_per_execution("auto", 37, "fit")[0], 1e9),
                              ("not_dividing", 4, 1e9), ("tight", 37, 1e-9)):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=per_call)
    job = Job(model=model, train_epochs=lambda epochs, skip: data.repeat(epochs).skip(skip), validation=None,
              epochs=2, steps_per_epoch=37, terminate_on_nan=False)
    ends = Ends()
    print("RUN", name, flush=True)
    train_fit(job, [ends], "none", max_call_seconds=bound)
    out[name] = {"per_call": per_call, "ends": ends.ends, "steps": int(model.optimizer.iterations.numpy())}
print("OUT", json.dumps(out))
"""


@pytest.mark.slow
def test_fit_keeps_exact_epochs_on_a_prime_step_count_and_warns_about_a_long_call():
    """fit keeps exact epochs on a prime step count, and warns once about a call over the bound.
    Trains its own models: the steps per call and the call-time bound under test change how fit trains."""
    result = run_python(FIT)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.split("OUT", 1)[1])
    # tfgpu's auto for 37 steps with fit: one step a call (not the whole epoch), 74 steps in two epochs.
    assert runs["tfgpu"]["per_call"] == 1 and runs["tfgpu"]["steps"] == 74
    assert runs["tfgpu"]["ends"] == list(range(37)) * 2
    # Why fit needs a divisor: Keras 3.15.1 runs ceil(37 / 4) whole calls of 4, so the first epoch takes
    # 40 steps, 3 of the next one's, and the last epoch runs out of batches.
    assert runs["not_dividing"]["ends"] == list(range(3, 40, 4)) + list(range(3, 36, 4))
    assert "Your input ran out of data" in result.stderr
    # fit cannot shorten a call: it says so once, and what to change.
    before, tight = result.stdout.split("RUN tight")
    assert "warning" not in before
    assert tight.count("tfgpu: warning: a training call of 37 steps took") == 1
    assert "lower train.steps_per_execution, or use train.loop: custom" in tight
