"""Where a run reports as it goes: MLflow (``output.mlflow``) and, for a sweep's trial, the Optuna study.

:mod:`.mlflow` tracks each run (and each sweep) through ``mlflow.MlflowClient``; :mod:`.study` opens a
sweep's study (storage, sampler, pruner, search space) and gives a trial's run the callback that reports
its metric after each epoch and stops it when the pruner says so. Training uses both (as Keras callbacks),
so this package sits below :mod:`tfgpu.training`; running a sweep is :mod:`tfgpu.experiments`'.
"""
