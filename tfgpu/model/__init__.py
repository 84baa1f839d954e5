"""Building the Keras model a recipe describes: layers, a ``keras.applications`` backbone, earlier weights, the learning rate.

:mod:`.keras_model` (``model:`` -> model, optimizer, loss and metrics, with Keras's names checked),
:mod:`.backbone` (``model.application``), :mod:`.transfer` (``model.init_from``, ``model.freeze``,
``train.unfreeze``) and :mod:`.schedules` (``train.lr_schedule``: warmup and decay, planned in pure
Python, built as a Keras schedule). Keras is imported only inside the functions that build.
"""
