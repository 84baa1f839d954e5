"""An unmodified Keras script: MirroredStrategy over whatever devices TensorFlow has, model.fit on MNIST."""
import os

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
data = np.load(os.path.join(os.environ["TFGPU_DATA_DIR"], "mnist", "mnist.npz"))
x = data["x_train"][:8192].astype("float32")[..., None] / 255.0
y = data["y_train"][:8192]
with strategy.scope():
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=256, epochs=2, verbose=0)
print("replicas", strategy.num_replicas_in_sync)
print("accuracy", history.history["accuracy"][-1])
