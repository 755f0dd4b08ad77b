"""Shared pytest configuration.

Markers:
    slow: deep or large models (still run in CI).
    multibackend: also run under KERAS_BACKEND=jax and KERAS_BACKEND=torch.
    e2e: end-to-end (training to accuracy, multi-process, kill-and-resume).

Under a backend other than TensorFlow only `multibackend` tests are collected: the
rest exercise TensorFlow-only code (tf.data, tf.distribute, SavedModel).
"""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# What `import keras_preact` sets before TensorFlow loads (its oneDNN CPU kernels): the
# tests import Keras first, so they say it here to run as users do.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def pytest_configure(config):
    # The package's caches (weights, decoded image folders) go to a temporary folder, never
    # the user's home. Set before collection: some test modules copy os.environ on import.
    config.keras_preact_home = os.environ["KERAS_PREACT_HOME"] = tempfile.mkdtemp(
        prefix="keras_preact_home-")
    config.addinivalue_line("markers", "slow: deep or large models (still run in CI)")
    config.addinivalue_line(
        "markers", "multibackend: also runs under the JAX and PyTorch backends"
    )
    config.addinivalue_line("markers", "e2e: end-to-end test, run once on a small model")


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "keras_preact_home", ""), ignore_errors=True)


def _backend():
    import keras

    return keras.backend.backend()


def pytest_collection_modifyitems(config, items):
    if _backend() == "tensorflow":
        return
    keep, drop = [], []
    for item in items:
        (keep if item.get_closest_marker("multibackend") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Every test starts from a clean Keras session (names, global policy)."""
    import keras

    keras.utils.clear_session()
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def tiny_model_kwargs():
    """A 3-stage, one-unit-per-stage config that builds in well under a second."""
    from tests.helpers import TINY

    return dict(TINY["architecture"], input_shape=(16, 16, 3))


@pytest.fixture
def built_convs(monkeypatch):
    """The names of the Conv2D layers built while the test runs (to check that bad
    input is refused before any layer is built)."""
    import keras

    built = []
    original = keras.layers.Conv2D.__init__

    def spy(self, *args, **kwargs):
        built.append(kwargs.get("name"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Conv2D, "__init__", spy)
    return built


@pytest.fixture
def cifar_dir(tmp_path):
    """CIFAR-10 in the python-pickle layout: 5 x 4 train images, 6 test images."""
    from tests import data_fixtures

    train, test = data_fixtures.cifar10_splits(per_batch=4, num_test=6)
    return data_fixtures.write_cifar10_python(str(tmp_path / "data"), train, test)


def pytest_terminal_summary(terminalreporter):
    """How many of the documentation's examples the tests run, and how many are marked."""
    from tests.helpers import doc_blocks

    for lang, what in (("python", "Python examples"), ("bash", "command blocks")):
        blocks = doc_blocks(lang)
        marked = sum(b.mark == "not run" for b in blocks)
        terminalreporter.write_line(
            f"docs: {len(blocks)} {what} in README.md and docs/: {len(blocks) - marked} run "
            f"by tests/test_docs*.py, {marked} marked not run")
