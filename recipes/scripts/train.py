"""A plain Keras script for ``tfgpu launch``: a small MNIST classifier, trained with ``model.fit``.

    tfgpu launch recipes/gpu.yaml -- recipes/scripts/train.py --epochs 1
    tfgpu launch recipes/gpu.yaml --workers 2 -- recipes/scripts/train.py --steps 50
    python recipes/scripts/train.py                  # alone: tfgpu.setup() reads TFGPU_CONFIG, else the defaults

It calls ``tfgpu.setup()`` first (under ``tfgpu launch`` that returns what the
launcher applied) and takes the strategy from it: ``MirroredStrategy`` (or one
device) in one process, ``MultiWorkerMirroredStrategy`` when ``TF_CONFIG``
lists several workers, as ``tfgpu launch --workers N`` sets it. The data is the
real MNIST from ``$TFGPU_DATA_DIR/mnist/mnist.npz``, else Keras's download. It
prints the test accuracy of the trained model.
"""

import argparse
import json
import os

import tfgpu

info = tfgpu.setup()  # before TensorFlow: the devices, the strategy, the global batch

import keras  # noqa: E402  (configured by setup())
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=1, help="epochs to train (default 1)")
parser.add_argument("--steps", type=int, default=None, help="steps per epoch (default: the whole training set)")
parser.add_argument("--batch-size", type=int, default=None,
                    help="samples per replica (default: the config's train.batch_size_per_replica)")
args = parser.parse_args()


def load_mnist() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(x_train, y_train), (x_test, y_test): uint8 images (N, 28, 28) and their digits."""
    root = os.environ.get("TFGPU_DATA_DIR")
    if root:
        with np.load(os.path.join(root, "mnist", "mnist.npz")) as data:
            return (data["x_train"], data["y_train"]), (data["x_test"], data["y_test"])
    return keras.datasets.mnist.load_data()


def batches(x: np.ndarray, y: np.ndarray, global_batch: int, shuffle: bool) -> tf.data.Dataset:
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        data = data.shuffle(len(x), seed=42).repeat()
    data = data.batch(global_batch).map(lambda x, y: (tf.cast(x, tf.float32)[..., None] / 255.0, y))
    options = tf.data.Options()  # every worker reads all of it and trains on its own share of each batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return data.with_options(options).prefetch(tf.data.AUTOTUNE)


strategy = info.strategy or tf.distribute.get_strategy()
replicas = strategy.num_replicas_in_sync
global_batch = (args.batch_size or info.plan.batch_size_per_replica) * replicas
(x_train, y_train), (x_test, y_test) = load_mnist()
steps = args.steps or len(x_train) // global_batch
task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
name = ("MultiWorkerMirroredStrategy" if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        else type(strategy).__name__)
print(f"{name}: {replicas} replica(s){' (worker %s)' % task['index'] if task else ''}, "
      f"global batch {global_batch}, {args.epochs} epoch(s) of {steps} steps", flush=True)

with strategy.scope():
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

model.fit(batches(x_train, y_train, global_batch, shuffle=True), epochs=args.epochs, steps_per_epoch=steps,
          shuffle=False,  # the dataset shuffles itself (Keras warns about shuffle=True with a tf.data.Dataset)
          verbose=2)
result = model.evaluate(batches(x_test, y_test, global_batch, shuffle=False), verbose=0, return_dict=True)
print(f"test accuracy: {result['accuracy']:.4f} ({len(x_test)} test images)", flush=True)
