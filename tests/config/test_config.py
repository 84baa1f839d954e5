"""The schema: defaults, valid files, overrides and their precedence, and many invalid inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfgpu.config import Config, load_config, parse_override
from tfgpu.errors import ConfigError, UsageError

from ..conftest import RECIPES


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), overrides=overrides)
    assert info.value.exit_code == 3
    return str(info.value)


def test_defaults_are_documented_values():
    cfg = load_config({})
    assert cfg.devices.visible_gpus == "all"
    assert cfg.devices.memory_growth is None
    assert cfg.devices.soft_placement is True
    assert cfg.tensorflow.log_level == 2
    assert cfg.distribute.strategy == "auto"
    assert cfg.train.loop == "fit" and cfg.train.epochs == 10 and cfg.train.batch_size_per_replica == 32
    assert cfg.output.dir == "runs"


def test_seed_recipe_is_the_seed_example():
    cfg = load_config(RECIPES / "mnist.yaml")
    assert [next(iter(layer)) for layer in cfg.model.layers] == [
        "Conv2D", "MaxPooling2D", "Conv2D", "MaxPooling2D", "Flatten", "Dense"]
    assert cfg.model.layers[0]["Conv2D"] == {"filters": 16, "kernel_size": 3, "activation": "relu"}
    assert cfg.model.layers[2]["Conv2D"]["filters"] == 32
    assert cfg.model.layers[5]["Dense"] == {"units": 10, "activation": "softmax"}
    assert cfg.model.optimizer == "adam" and cfg.model.loss == "sparse_categorical_crossentropy"
    assert cfg.model.metrics == ["accuracy"]
    assert cfg.train.epochs == 10 and cfg.train.batch_size_per_replica == 4096
    assert cfg.devices.memory_growth is True and cfg.distribute.strategy == "mirrored"
    assert load_config(RECIPES / "mnist_custom.yaml").train.loop == "custom"


def test_precedence_defaults_file_set_keywords(tmp_path):
    path = write(tmp_path, "train: {epochs: 5, loop: fit}\ndevices: {soft_placement: false}\n")
    cfg = load_config(path, overrides=["train.epochs=3"], train={"loop": "custom"})
    assert cfg.train.epochs == 3            # --set beats the file
    assert cfg.train.loop == "custom"       # keyword beats the file
    assert cfg.devices.soft_placement is False  # the file beats the default
    assert cfg.train.batch_size_per_replica == 32  # default


def test_tfgpu_config_env_is_used_when_nothing_is_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("TFGPU_CONFIG", str(write(tmp_path, "train: {epochs: 7}\n")))
    assert load_config().train.epochs == 7


def test_override_values_are_read_as_yaml():
    assert parse_override("devices.visible_gpus=[0, 2]") == (("devices", "visible_gpus"), [0, 2])
    assert parse_override("devices.soft_placement=false") == (("devices", "soft_placement"), False)
    assert parse_override("output.name=exp1") == (("output", "name"), "exp1")


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(RECIPES / "mnist.yaml", overrides=["train.loop=custom"])
    again = load_config(write(tmp_path, cfg.to_yaml()))
    assert again == cfg


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train:\n  epochs: 3\n  epochz: 4\n", ["recipe.yaml:3", "unknown key 'train.epochz'", "Did you mean 'train.epochs'?"]),
        ("devics:\n  memory_growth: true\n", ["recipe.yaml:1", "unknown key 'devics'", "Did you mean 'devices'?"]),
        ("train:\n  epochs: 0\n", ["recipe.yaml:2", "'train.epochs'", "greater than or equal to 1", "Received: 0 (int)"]),
        ("train:\n  batch_size_per_replica: -8\n", ["'train.batch_size_per_replica'", "Received: -8"]),
        ("train:\n  epochs: three\n", ["'train.epochs'", "valid integer", "Received: 'three' (str)"]),
        ("devices:\n  memory_fraction: 1.5\n", ["recipe.yaml:2", "'devices.memory_fraction'", "less than or equal to 1"]),
        ("devices:\n  memory_fraction: 0\n", ["'devices.memory_fraction'", "greater than 0"]),
        ("devices:\n  visible_gpus: [0, 0]\n", ["'devices.visible_gpus'", "GPU index 0 is listed twice"]),
        ("devices:\n  visible_gpus: [-1]\n", ["'devices.visible_gpus'", "integer >= 0"]),
        ("devices:\n  visible_gpus: some\n", ["'devices.visible_gpus'", '"all", "none" or a list']),
        ("devices:\n  memory_limit_mib: 1024\n  memory_fraction: 0.5\n", ["both set"]),
        ("devices:\n  gpu_logical_devices: 2\n", ["needs a memory size to split"]),
        ("distribute:\n  cross_device_ops: off\n", ["'distribute.cross_device_ops'", "Received: False (bool)", "YAML reads a bare yes/no/on/off"]),
        ("distribute:\n  strategy: horovod\n", ["'distribute.strategy'", "'mirrored', 'one_device', 'multi_worker_mirrored' or 'default'"]),
        ("distribute:\n  devices: [/tpu:0]\n", ["'/tpu:0' is not a device name"]),
        ("train:\n  loop: keras\n", ["'train.loop'", "'fit' or 'custom'"]),
        ("model:\n  layers: [{Dense: 3}]\n", ["layer 0", "'ClassName: {arguments}'"]),
        ("model:\n  optimizer: {learning_rate: 0.1}\n", ["needs a 'name' key"]),
        ("model:\n  builder: not a path\n", ["'package.module:function'"]),
        ("- devices\n- train\n", ["top level must be a mapping", "Received: ['devices', 'train'] (list)"]),
        ("train: [1, 2\n", ["recipe.yaml:2", "not valid YAML"]),
        ("train:\n  epochs: 3\n  epochs: 4\n", ["recipe.yaml:3", "'train.epochs' appears twice (first at line 2)"]),
        ("train: !!python/object/apply:os.system ['echo hi']\n", ["tag is not allowed", "safe_load"]),
        ("tensorflow:\n  log_level: 7\n", ["'tensorflow.log_level'", "less than or equal to 3"]),
        ("output:\n  name: 'a/b'\n", ["'output.name'", "may only hold letters"]),
    ],
)
def test_invalid_configs_name_key_value_and_line(tmp_path, text, expected):
    message = error_of(tmp_path, text)
    for part in expected:
        assert part in message, f"{part!r} not in:\n{message}"


def test_several_problems_are_reported_together(tmp_path):
    message = error_of(tmp_path, "train:\n  epochs: 0\n  loop: nope\n")
    assert message.startswith("2 problems") and "train.epochs" in message and "train.loop" in message


def test_bad_override_names_the_set_option(tmp_path):
    message = error_of(tmp_path, "train: {epochs: 2}\n", "train.epochs=0")
    assert "--set train.epochs=0" in message and "greater than or equal to 1" in message
    with pytest.raises(UsageError, match="expected 'section.key=value'") as info:  # how --set was written: exit 2
        parse_override("epochs")
    assert info.value.exit_code == 2 and not isinstance(info.value, ConfigError)
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config({"train": {"epochs": 2}}, overrides=["train.epochs.x=1"])


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_config_object_passes_through():
    cfg = Config()
    assert load_config(cfg) is cfg


#: One bad config per kind of pydantic error the schema raises (bool_type, int_type, ..., too_short).
BAD_BY_ERROR_TYPE = {
    "bool_type": ({"output": {"save_model": [True]}}, "'output.save_model': Input should be a valid boolean"),
    "int_type": ({"train": {"epochs": "three"}}, "'train.epochs': Input should be a valid integer"),
    "float_type": ({"data": {"validation_split": "x"}}, "'data.validation_split': Input should be a valid number"),
    "string_type": ({"data": {"path": [1]}}, "'data.path': Input should be a valid string"),
    "list_type": ({"distribute": {"devices": 3}}, "'distribute.devices': Input should be a valid list"),
    "dict_type": ({"model": {"builder_args": 3}}, "'model.builder_args': Input should be a valid dictionary"),
    "greater_than": ({"devices": {"memory_limit_mib": 0}}, "'devices.memory_limit_mib': Input should be greater than 0."),
    "greater_than float": ({"devices": {"memory_fraction": 0}}, "'devices.memory_fraction': Input should be greater than 0."),
    "greater_than_equal": ({"train": {"epochs": 0}}, "'train.epochs': Input should be greater than or equal to 1."),
    "less_than": ({"data": {"validation_split": 1.5}}, "'data.validation_split': Input should be less than 1."),
    "less_than_equal": ({"tensorflow": {"log_level": 7}}, "'tensorflow.log_level': Input should be less than or equal to 3."),
    "literal_error": ({"train": {"loop": "keras"}}, "'train.loop': Input should be 'fit' or 'custom'"),
    "model_type": ({"train": 3}, "'train' must be a mapping of its keys (loop, epochs, "),
    "missing": ({"distribute": {"cluster": {}}}, "'distribute.cluster.workers': Field required."),
    "too_short": ({"distribute": {"cluster": {"workers": []}}},
                  "'distribute.cluster.workers': List should have at least 1 item after validation, not 0."),
    "value_error": ({"devices": {"visible_gpus": [0, 0]}}, "'devices.visible_gpus': GPU index 0 is listed twice."),
    "key_error": ({"train": {"profile_steps": [1, 2]}}, "'train.profile_steps': profiling writes into the TensorBoard"),
    "extra_forbidden": ({"train": {"epochz": 1}}, "unknown key 'train.epochz'. Did you mean 'train.epochs'?"),
    "invalid_key": ({"model": {"builder_args": {1: 2}}}, "'model.builder_args': keys must be text. Received the key 1"),
}


def _message(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(data)
    return info.value.message


@pytest.mark.parametrize("kind", list(BAD_BY_ERROR_TYPE))
def test_messages_are_written_from_the_error_type_and_ctx_not_pydantics_words(kind, monkeypatch):
    """A pydantic release that rewords its English messages changes none of tfgpu's: each problem is written
    from the error's type and ctx (ctx['ge'], ctx['expected'], ctx['error'], ...), never from its msg."""
    from tfgpu.config import source  # noqa: PLC0415

    data, expected = BAD_BY_ERROR_TYPE[kind]
    message = _message(data)
    assert expected in message, message

    class Reworded:
        def __init__(self, exc):
            self.exc = exc

        def errors(self):  # tfgpu's own errors (key_error) keep their text: it is tfgpu's
            return [e if e["type"] == "key_error" else {**e, "msg": "REWORDED BY PYDANTIC"} for e in self.exc.errors()]

    render = source.validation_error
    monkeypatch.setattr(source, "validation_error", lambda exc, *rest: render(Reworded(exc), *rest))
    assert _message(data) == message


def test_requirement_reads_each_error_types_ctx():
    from tfgpu.config.messages import requirement  # noqa: PLC0415

    def said(kind: str, **ctx) -> str:
        return requirement({"type": kind, "ctx": ctx, "msg": "pydantic's words", "loc": (), "input": None})

    assert said("greater_than_equal", ge=1) == "Input should be greater than or equal to 1"
    assert said("less_than_equal", le=1.0) == "Input should be less than or equal to 1"  # a float field's bound
    assert said("greater_than", gt=0.5) == "Input should be greater than 0.5"
    assert said("literal_error", expected="'fit' or 'custom'") == "Input should be 'fit' or 'custom'"
    assert said("string_pattern_mismatch", pattern="^a$") == "String should match pattern '^a$'"
    assert said("value_error", error=ValueError("GPU index 0 is listed twice")) == "GPU index 0 is listed twice"
    assert said("too_short", field_type="List", min_length=2, actual_length=1) == (
        "List should have at least 2 items after validation, not 1")
    # tfgpu's own error types (PydanticCustomError) carry tfgpu's text; an unknown type falls back to it too
    assert said("key_error", loc=("x",)) == "pydantic's words"
    assert said("greater_than") == "pydantic's words"  # a ctx without its bound: the text, not a KeyError
