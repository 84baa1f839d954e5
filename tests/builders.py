"""Model builders named by recipes in the tests (``tests.builders:small_cnn``)."""

import keras


def small_cnn(input_shape, num_classes, filters=8):
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Conv2D(filters, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])


def not_a_model(input_shape, num_classes):
    return "a string"
