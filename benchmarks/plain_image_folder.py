"""Baseline 3: an image folder trained the way Keras's tutorial does it, by hand.

``keras.utils.image_dataset_from_directory`` for the training and validation
folders (batch = per-GPU batch x GPUs), the tutorial's
``configure_for_performance`` (``cache()``, ``shuffle(1000)`` of batches,
``prefetch(AUTOTUNE)``), a ``Rescaling(1/255)`` layer in the model,
MirroredStrategy and ``model.fit``. The only additions are the time stamps of
``timing.py``. Tutorial: https://www.tensorflow.org/tutorials/load_data/images

    python benchmarks/plain_image_folder.py --train png/train --validation png/test --replicas 2
"""

import argparse

import tensorflow as tf
import keras

from timing import Clock, keras_callback, report

parser = argparse.ArgumentParser()
parser.add_argument("--train", required=True, help="folder of class folders")
parser.add_argument("--validation", required=True, help="folder of class folders")
parser.add_argument("--replicas", type=int, default=1)
parser.add_argument("--batch-per-replica", type=int, default=128)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

if args.replicas > 1:  # stands in for N GPUs on a CPU-only machine
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
keras.utils.set_random_seed(args.seed)

strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")][:args.replicas])
batch_size = args.batch_per_replica * strategy.num_replicas_in_sync
train_ds = keras.utils.image_dataset_from_directory(args.train, seed=args.seed, image_size=(28, 28),
                                                    color_mode="grayscale", batch_size=batch_size)
val_ds = keras.utils.image_dataset_from_directory(args.validation, image_size=(28, 28), color_mode="grayscale",
                                                  batch_size=batch_size, shuffle=False)
samples = len(train_ds.file_paths)  # Keras records the files it found
AUTOTUNE = tf.data.AUTOTUNE
train_ds = train_ds.cache().shuffle(1000).prefetch(buffer_size=AUTOTUNE)
val_ds = val_ds.cache().prefetch(buffer_size=AUTOTUNE)

with strategy.scope():
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

clock = Clock()
history = model.fit(train_ds, validation_data=val_ds, epochs=args.epochs, callbacks=[keras_callback(clock)])
report(clock, samples, history.history["val_accuracy"][-1], parameters=model.count_params())
