"""Property tests: whatever a user writes, loading a config ends in a Config or a ConfigError.

Arbitrary text, bytes and structured YAML documents (keys from the real schema mixed with
random ones, values of every YAML type), arbitrary values for real keys (as a dict, as
``--set`` overrides and as ``setup()`` keyword arguments): the only outcomes allowed are a
valid :class:`tfgpu.config.Config` or a :class:`tfgpu.errors.ConfigError` whose message is
one non-empty paragraph without a traceback. Never another exception.

The data sources get the same treatment: any data section for any kind, any CSV, any bytes
in an image folder or where TFRecords are expected end in data (or a valid config), or in a
ConfigError/DataError of one paragraph, checked before TensorFlow starts.
"""

from __future__ import annotations

import datetime
import itertools
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfgpu.config import Config, DataConfig, load_config
from tfgpu.config.schema import DATA_KIND_KEYS
from tfgpu.data import LoadContext, source_for
from tfgpu.errors import ConfigError, DataError, TfgpuError, UsageError

from ..conftest import one_paragraph

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SECTIONS = {name: list(field.annotation.model_fields) for name, field in Config.model_fields.items()
            if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields")}  # not ``backend``
KEY_PATHS = [(section, key) for section, keys in SECTIONS.items() for key in keys]
SCHEMA_WORDS = sorted(set(SECTIONS) | {k for keys in SECTIONS.values() for k in keys}
                      | {"name", "units", "Dense", "backend"})
YAML_WORDS = ["off", "on", "yes", "no", "y", "n", "true", "false", "null", "~", "auto", "all", "none", "mnist",
              "2024-01-01", "0x1f", "0o17", "1e3", "1.0e+3", ".nan", ".inf", "-.inf", "0", "-1", "1_000",
              "/gpu:0", "/cpu:1", "adam", "fit", "custom", "tests.builders:small_cnn", "a/b", ""]

#: Values that are valid for some keys, so that the valid path is exercised as often as the error paths.
PLAUSIBLE = [1, 2, 3, 32, 0, 0.5, 1.0, 4096, True, False, None, "auto", "all", "none", "mirrored", "one_device",
             "default", "nccl", "hierarchical_copy", "fit", "custom", "linear", "sqrt", "bar", "epoch", "float32",
             "mixed_float16", "cuda_malloc_async", "mnist", "runs", "exp1", ["/cpu:0"], ["/gpu:0", "/gpu:1"], [0],
             [0, 1], ["accuracy"], "adam", {"name": "adam", "learning_rate": 0.01}, [{"Dense": {"units": 10}}],
             ["Flatten"], "tests.builders:small_cnn", {"filters": 4}, {},
             "keras", "arrays", "image_folder", "csv", "tfrecord", "builder", "tfds", "cifar10", "fashion_mnist", [64, 64],
             "rgb", "grayscale", "1/255", 0.2, ["a", "b"], {"image": {"encoding": "png"}, "label": {"dtype": "int64"}},
             {"x_train": "features"}, "label", "photos/*.tfrecord", "GZIP", "coarse", [2, 5],
             {"train": "train[:90%]", "validation": "train[90%:]"}, "~/tensorflow_datasets", "jax", "tensorflow"]

_counter = itertools.count()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("properties")


def outcome(source, *, overrides=(), **sections):
    """Load; return the Config, or the ConfigError (a malformed --set item: the UsageError) after checking its
    message. Anything else fails."""
    try:
        cfg = load_config(source, overrides=overrides, **sections)
    except UsageError as exc:  # a --set item that is not KEY=VALUE, or whose value is not YAML: exit 2
        assert overrides and exc.exit_code == 2 and exc.message.startswith("--set "), exc.message
        one_paragraph(exc.message)
        assert exc.hint.strip(), f"no fix given for:\n{exc.message}"
        return exc
    except ConfigError as exc:
        assert isinstance(exc, TfgpuError) and exc.exit_code == 3
        message = exc.message
        assert isinstance(message, str)
        one_paragraph(message)
        assert "Traceback" not in str(exc), str(exc)
        assert exc.hint.strip(), f"no fix given for:\n{message}"
        return exc
    assert isinstance(cfg, Config)
    return cfg


def from_file(workdir: Path, content: str | bytes):
    path = workdir / f"recipe-{next(_counter)}.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    try:
        return outcome(path)
    finally:
        path.unlink()


# --------------------------------------------------------------------------- strategies

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.sampled_from(YAML_WORDS),
    st.dates(min_value=datetime.date(1900, 1, 1), max_value=datetime.date(2100, 1, 1)),
)
keys = st.one_of(st.sampled_from(SCHEMA_WORDS), st.text(max_size=12), st.integers(-3, 3), st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)),
    max_leaves=12,
)
#: Documents shaped like recipes: schema sections holding schema keys (or not), anything as values.
sections = st.dictionaries(
    st.one_of(st.sampled_from(list(SECTIONS)), keys),
    st.one_of(st.dictionaries(st.one_of(st.sampled_from(SCHEMA_WORDS), keys), values, max_size=5), values),
    max_size=5,
)
documents = st.one_of(sections, values)
#: Text assembled from YAML's own punctuation and words: reaches the scanner's and parser's error paths.
yaml_tokens = st.lists(
    st.sampled_from([":", ": ", "-", "- ", "[", "]", "{", "}", ",", "'", '"', "\n", "  ", "\t", "#", "?", "|", ">",
                     "&a ", "*a", "!!str ", "!!python/object/apply:os.system ", "!foo ", "%YAML 1.1\n", "---\n",
                     "...\n", "\\", "\x00", "\ufeff", "<<: ", *SCHEMA_WORDS, *YAML_WORDS]),
    max_size=40,
).map("".join)


def yaml_text(value) -> str:
    return yaml.safe_dump(value, allow_unicode=True, sort_keys=False)


# --------------------------------------------------------------------------- properties

@SETTINGS
@given(text=st.text(max_size=300))
def test_arbitrary_text(workdir, text):
    from_file(workdir, text)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(workdir, data):
    from_file(workdir, data)


@SETTINGS
@given(text=yaml_tokens)
def test_yaml_like_text(workdir, text):
    from_file(workdir, text)


@SETTINGS
@given(document=documents)
def test_structured_documents_as_files(workdir, document):
    result = from_file(workdir, yaml_text(document))
    assert isinstance(result, (Config, ConfigError))


@SETTINGS
@given(document=documents)
def test_structured_documents_as_dicts(document):
    outcome(document if isinstance(document, dict) else {"train": document})


@SETTINGS
@given(path=st.sampled_from(KEY_PATHS), value=st.one_of(st.sampled_from(PLAUSIBLE), values))
def test_any_value_for_a_real_key(path, value):
    """The same value, given as a dict, a --set override and a setup() keyword, gets the same outcome."""
    section, key = path
    as_dict = outcome({section: {key: value}})
    as_keyword = outcome({}, **{section: {key: value}})
    assert type(as_dict) is type(as_keyword)
    if isinstance(as_dict, Config):
        assert as_dict.to_yaml() == as_keyword.to_yaml()  # compared as text: NaN != NaN
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
    except yaml.YAMLError:
        return
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    as_set = outcome({}, overrides=[f"{section}.{key}={text}"])
    if isinstance(as_dict, Config) and "\n" not in text:
        assert isinstance(as_set, Config) and as_set.to_yaml() == as_dict.to_yaml(), (text, as_set)


def _valid_alone(section: str, key: str, value) -> bool:
    try:
        load_config({section: {key: value}})
    except ConfigError:
        return False
    return True


#: (section, key, value) of PLAUSIBLE that are valid on their own: combinations of them are often valid too.
VALID_SETTINGS = [(s, k, v) for s, k in KEY_PATHS for v in PLAUSIBLE if _valid_alone(s, k, v)]


@SETTINGS
@given(settings_=st.lists(st.sampled_from(VALID_SETTINGS), min_size=1, max_size=4))
def test_a_run_directorys_config_yaml_loads_as_the_config_it_saved(workdir, settings_):
    """Whatever valid config a run saves, its config.yaml (the keys as given) loads to the same config with the
    same keys set (so a replay plans alike), and config.resolved.yaml to the same values."""
    from tfgpu.training.layout import CONFIG_FILE, RESOLVED_CONFIG_FILE, write_config  # noqa: PLC0415

    data: dict = {}
    for section, key, value in settings_:
        data.setdefault(section, {})[key] = value
    cfg = outcome(data)
    if not isinstance(cfg, Config):
        return
    run_dir = workdir / f"run-{next(_counter)}"
    run_dir.mkdir()
    try:
        write_config(run_dir, cfg)
        given, resolved = load_config(run_dir / CONFIG_FILE), load_config(run_dir / RESOLVED_CONFIG_FILE)
    finally:
        shutil.rmtree(run_dir)
    assert given.to_yaml() == cfg.to_yaml() == resolved.to_yaml()  # compared as text: NaN != NaN
    assert yaml_text(given.explicit_dict()) == yaml_text(cfg.explicit_dict())


@SETTINGS
@given(path=st.one_of(st.sampled_from([f"{s}.{k}" for s, k in KEY_PATHS]), st.text(max_size=30)),
       raw=st.one_of(st.text(max_size=40), st.sampled_from(YAML_WORDS + [yaml_text(v).strip().removesuffix("\n...")
                                                             for v in PLAUSIBLE]), yaml_tokens))
def test_any_set_override(path, raw):
    outcome({}, overrides=[f"{path}={raw}"])
    outcome({}, overrides=[raw])


@SETTINGS
@given(document=sections, path=st.sampled_from(KEY_PATHS), raw=st.sampled_from(YAML_WORDS))
def test_overrides_on_top_of_any_document(workdir, document, path, raw):
    path_file = workdir / f"recipe-{next(_counter)}.yaml"
    path_file.write_text(yaml_text(document), encoding="utf-8")
    try:
        outcome(path_file, overrides=[f"{path[0]}.{path[1]}={raw}", "train.epochs=1"])
    finally:
        path_file.unlink()


PYTHON_TAGS = [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:os.system ['touch {marker}']",
    "!!python/object/apply:subprocess.call [['touch', '{marker}']]",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/object:tfgpu.config.Config {{}}",
    "!!python/tuple [1, 2]",
]


@SETTINGS
@given(tag=st.sampled_from(PYTHON_TAGS), path=st.sampled_from(KEY_PATHS + [("model", "builder_args")]),
       nested=st.booleans())
def test_python_tags_are_refused_and_run_nothing(workdir, tag, path, nested):
    marker = workdir / "pwned"
    value = tag.format(marker=marker)
    text = f"{path[0]}:\n  {path[1]}:\n    inner: {value}\n" if nested else f"{path[0]}:\n  {path[1]}: {value}\n"
    result = from_file(workdir, text)
    assert isinstance(result, ConfigError), f"accepted: {text}"
    assert "tag is not allowed" in result.message
    with pytest.raises(UsageError, match="tag|not valid YAML"):  # (a --set value that is not YAML: exit 2)
        load_config({}, overrides=[f"{path[0]}.{path[1]}={value}"])
    assert not marker.exists()


# --------------------------------------------------------------------------- data sections and data files

DATA_KEYS = list(DataConfig.model_fields)


@SETTINGS
@given(kind=st.sampled_from(list(DATA_KIND_KEYS) + ["mnist"]),
       extra=st.dictionaries(st.sampled_from(DATA_KEYS), st.one_of(st.sampled_from(PLAUSIBLE), values), max_size=4))
def test_any_data_section(kind, extra):
    """Any mix of data keys, for any kind: a Config whose kind reads every non-default key set, or one ConfigError."""
    result = outcome({"data": {"kind": kind, **extra}})
    if isinstance(result, Config):
        fields = DataConfig.model_fields
        stray = {k for k in extra if k not in result.data.kind_keys()
                 and getattr(result.data, k) != fields[k].get_default(call_default_factory=True)}
        assert not stray, (result.data.kind, stray)


def data_outcome(data: dict):
    """Check and load a data source (in-memory kinds need no TensorFlow); the only outcomes: Data or a DataError."""
    try:
        cfg = load_config({"data": data})
        source = source_for(cfg.data, cfg.model.loss)
        source.check()
        if cfg.data.kind in ("csv", "arrays"):
            return source.load(LoadContext(global_batch_size=8, num_replicas=1))
        return source
    except DataError as exc:
        assert exc.exit_code == 5 and exc.hint.strip()
        one_paragraph(exc.message)
        return exc


csv_text = st.lists(st.lists(st.one_of(st.sampled_from(["1", "0", "-2.5", "3e-4", "", " ", "nan", "inf", "y", "a",
                                                        "\"q,\"", "1,2", "x\ny"]), st.text(max_size=5)),
                             max_size=5), max_size=6)


@SETTINGS
@given(rows=csv_text, header=st.booleans())
def test_any_csv_is_read_or_refused_with_one_paragraph(workdir, rows, header):
    lines = ([["a", "b", "y"]] if header else []) + rows
    path = workdir / f"table-{next(_counter)}.csv"
    path.write_text("\n".join(",".join(r) for r in lines), encoding="utf-8")
    try:
        result = data_outcome({"kind": "csv", "path": str(path), "label": "y"})
    finally:
        path.unlink()
    if not isinstance(result, DataError):
        assert result.train.x.dtype == np.float32 and np.isfinite(result.train.x).all()
        assert len(result.train.x) == len(result.train.y) > 0


@SETTINGS
@given(content=st.one_of(st.binary(max_size=200), st.sampled_from([b"\x89PNG\r\n\x1a\n", b"GIF89a", b"BM", b"\xff\xd8\xff"]).flatmap(
    lambda head: st.binary(max_size=100).map(lambda tail: head + tail))))
def test_any_bytes_in_an_image_folder_are_read_or_refused(workdir, content):
    root = workdir / f"images-{next(_counter)}"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        Image.fromarray(np.zeros((3, 3), np.uint8)).save(root / cls / "ok.png")
    (root / "b" / "odd.png").write_bytes(content)
    try:
        data_outcome({"kind": "image_folder", "path": str(root)})
    finally:
        shutil.rmtree(root)


@SETTINGS
@given(content=st.binary(max_size=64), name=st.sampled_from(["r.tfrecord", "r.tfrecord.gz", "r.zz"]))
def test_any_bytes_as_tfrecord_files_pass_or_fail_the_framing_check(workdir, content, name):
    folder = workdir / f"records-{next(_counter)}"
    folder.mkdir()
    (folder / name).write_bytes(content)
    try:
        data_outcome({"kind": "tfrecord", "path": str(folder / name), "label": "y",
                      "features": {"x": {"shape": [2]}, "y": {"dtype": "int64"}}})
    finally:
        shutil.rmtree(folder)
