"""An unmodified multi-worker Keras script: MultiWorkerMirroredStrategy from TF_CONFIG, model.fit, evaluate."""
import os

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
data = np.load(os.path.join(os.environ["TFGPU_DATA_DIR"], "mnist", "mnist.npz"))
x = data["x_train"][:8192].astype("float32")[..., None] / 255.0
y = data["y_train"][:8192]
train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192, seed=1).batch(256)
with strategy.scope():
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(train, epochs=2, verbose=0)
result = model.evaluate(train.take(8), verbose=0, return_dict=True)
print("replicas", strategy.num_replicas_in_sync)
print("accuracy", history.history["accuracy"][-1], "evaluate", result["accuracy"])
