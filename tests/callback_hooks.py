"""A user callback named by recipes in tests/training/test_callbacks.py (``tests.callback_hooks:HookRecorder``)."""

import keras


class HookRecorder(keras.callbacks.Callback):
    """Appends each hook Keras calls (``name`` or ``name index``) to the file ``path``, one a line."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def _note(self, text):
        with open(self.path, "a") as f:
            f.write(text + "\n")

    def on_train_begin(self, logs=None):
        self._note("on_train_begin")

    def on_train_end(self, logs=None):
        self._note("on_train_end")

    def on_epoch_begin(self, epoch, logs=None):
        self._note(f"on_epoch_begin {epoch}")

    def on_epoch_end(self, epoch, logs=None):
        self._note(f"on_epoch_end {epoch} " + ",".join(sorted(logs or {})))

    def on_train_batch_begin(self, batch, logs=None):
        self._note(f"on_train_batch_begin {batch}")

    def on_train_batch_end(self, batch, logs=None):
        self._note(f"on_train_batch_end {batch}")

    def on_test_begin(self, logs=None):
        self._note("on_test_begin")

    def on_test_end(self, logs=None):
        self._note("on_test_end")

    def on_test_batch_begin(self, batch, logs=None):
        self._note(f"on_test_batch_begin {batch}")

    def on_test_batch_end(self, batch, logs=None):
        self._note(f"on_test_batch_end {batch}")


class NotACallback:
    def __init__(self, path=None):
        self.path = path


class KillAt(keras.callbacks.Callback):
    """Kills its own process (SIGKILL) when epoch ``epoch`` (from 0) begins, once: the file ``marker_file`` (inside
    the run directory: tfgpu resolves ``*_file`` arguments there) records it."""

    def __init__(self, epoch, marker_file):
        super().__init__()
        self.epoch, self.marker = epoch, marker_file

    def on_epoch_begin(self, epoch, logs=None):
        import os
        import signal

        if epoch == self.epoch and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
