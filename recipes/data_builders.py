"""Data builders for ``kind: builder`` recipes: your own ``tf.data`` code, called by tfgpu.

A builder is called after tfgpu has set the devices up, with the keyword
arguments it names among ``global_batch_size``, ``input_context`` (a
``tf.distribute.InputContext``) and ``seed``, plus ``data.builder_args``. It
returns ``(train, validation)`` or ``(train, validation, test)``: here
unbatched ``tf.data.Dataset``\\ s of ``(image, label)`` that tfgpu shuffles and
batches (``data.batched: false``).
"""

import os

import numpy as np
import tensorflow as tf


def mnist(input_context=None, validation_samples=2000):
    """MNIST from ``$TFGPU_DATA_DIR/mnist/mnist.npz``: (train, validation, test) of (uint8 (28, 28), uint8)."""
    path = os.path.join(os.environ.get("TFGPU_DATA_DIR", "../shared/data"), "mnist", "mnist.npz")
    with np.load(path) as data:
        x, y, x_test, y_test = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    train = tf.data.Dataset.from_tensor_slices((x[validation_samples:], y[validation_samples:]))
    validation = tf.data.Dataset.from_tensor_slices((x[:validation_samples], y[:validation_samples]))
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test))
    if input_context is not None and input_context.num_input_pipelines > 1:  # several machines: one part each
        train = train.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return train, validation, test
