"""The pytorchcv converter, end to end without the network.

The reference models are pytorchcv's own (random weights, random BatchNorm statistics),
saved exactly as imgclsmob publishes them (``{name}-{error}-{sha1[:8]}.pth`` inside
``.pth.zip``), served from 127.0.0.1 and resolved through a catalog entry pointed at
that server. Needs torch and pytorchcv (``pip install --no-deps pytorchcv==0.0.74``).
"""

import csv
import dataclasses
import hashlib
import os
import zipfile

import numpy as np
import pytest

import keras_preact as kp
from keras_preact.weights import catalog, fetch_weights
from tests.helpers import serve_directory

torch = pytest.importorskip("torch", reason="the torch extra: pip install 'keras-preact[torch]'")
try:
    import pytorchcv  # noqa: F401
except ImportError:  # pragma: no cover - the README's test command installs it
    pytest.fail(
        "pytorchcv is needed for the converter tests: "
        "pip install --no-deps pytorchcv==0.0.74", pytrace=False
    )

from keras_preact.weights.converters import pytorchcv as conv  # noqa: E402
from tests import references as ref  # noqa: E402

BOUND = 1e-4  # the largest allowed logit difference


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A static file server on 127.0.0.1 (free port) over a temporary folder."""
    root = tmp_path_factory.mktemp("release")
    with serve_directory(root) as url:
        yield root, url


def _publish(net, upstream_name, error, folder):
    """Saves `net` as imgclsmob publishes it; returns (zip name, member name, sha1)."""
    tmp = os.path.join(folder, upstream_name + ".tmp.pth")
    torch.save(net.state_dict(), tmp)
    with open(tmp, "rb") as f:
        sha1 = hashlib.sha1(f.read()).hexdigest()
    member = f"{upstream_name}-{error}-{sha1[:8]}.pth"
    zip_name = member + ".zip"
    with zipfile.ZipFile(os.path.join(folder, zip_name), "w") as zf:
        zf.write(tmp, arcname=member)
    os.remove(tmp)
    return zip_name, member, sha1


def _served_entry(key, server, *, net=None, upstream_name=None):
    root, base = server
    entry = catalog.get_entry(key)
    upstream_name = upstream_name or entry.upstream_name
    net = net if net is not None else ref.pytorchcv_reference(upstream_name, seed=0)
    metric = "top5_error" if entry.dataset == "imagenet2012" else "top1_error"
    error = f"{int(round(getattr(entry.metrics, metric) * 100)):04d}"
    zip_name, member, sha1 = _publish(net, upstream_name, error, str(root))
    return dataclasses.replace(entry, url=f"{base}/{zip_name}", archive_member=member,
                               hash=catalog.Hash("sha1", sha1)), net


@pytest.mark.parametrize(
    "key", ["preact_resnet20.cifar10", "preact_resnet164.cifar100", "preact_resnet18.imagenet"]
)
def test_served_checkpoint_resolves_and_matches_logits(key, server, tmp_path):
    entry, net = _served_entry(key, server)
    path = fetch_weights(entry, cache_dir=str(tmp_path / "cache"), progress=False,
                         build=kp.get_model)
    model = kp.get_model(entry.model, **entry.architecture, classifier_activation=None)
    model.load_weights(path)
    # The published models take normalised images; compare on the same ones.
    x = np.random.RandomState(1).randn(2, *entry.input_shape).astype("float32")
    diff = float(np.abs(np.asarray(model(x, training=False)) - ref.reference_logits(net, x)).max())
    assert diff <= BOUND
    # The manifest records a measured figure for this entry, within the same bound.
    recorded = entry.converter_max_abs_diff
    assert recorded is not None and recorded <= BOUND


def test_factory_with_preprocessing_matches_raw_pixels(server, tmp_path):
    """The catalog's preprocessing, built into the model, equals imgclsmob's transform."""
    entry, net = _served_entry("preact_resnet20.cifar10", server)
    path = fetch_weights(entry, cache_dir=str(tmp_path / "cache"), progress=False,
                         build=kp.get_model)
    model = kp.preact_resnet20(**entry.architecture, preprocessing=entry.preprocessing,
                               classifier_activation=None)
    model.load_weights(path)
    raw = np.random.RandomState(2).randint(0, 256, (2, 32, 32, 3)).astype("float32")
    mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2023, 0.1994, 0.2010])
    normalised = ((raw / 255.0 - mean) / std).astype("float32")
    diff = np.abs(np.asarray(model(raw, training=False)) - ref.reference_logits(net, normalised))
    assert float(diff.max()) <= BOUND


def test_checkpoint_of_another_depth_or_block_is_refused(server, tmp_path):
    # A ResNet-56 checkpoint published under the ResNet-20 entry: the hash is right,
    # the architecture is not.
    other = ref.pytorchcv_reference("preresnet56_cifar10", seed=0)
    entry, _ = _served_entry("preact_resnet20.cifar10", server, net=other,
                             upstream_name="preresnet20_cifar10")
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="does not match the architecture") as err:
        fetch_weights(entry, cache_dir=str(cache), progress=False, build=kp.get_model)
    assert "unexpected tensors" in str(err.value)
    assert not list(cache.glob("*.weights.h5"))  # nothing cached

    bottleneck = ref.pytorchcv_reference("preresnet164bn_cifar10", seed=0)
    state = ref.state_dict_arrays(bottleneck)
    with pytest.raises(ValueError, match="shape mismatches|missing"):
        conv.load_state_dict(kp.preact_resnet20(first_shared_preact=False), state)
    # An ImageNet checkpoint into a CIFAR model (and back) names both stems.
    imagenet = ref.state_dict_arrays(ref.pytorchcv_reference("preresnet18", seed=0))
    with pytest.raises(ValueError, match="ImageNet PreResNet.*CIFAR PreResNet"):
        conv.load_state_dict(kp.preact_resnet20(first_shared_preact=False), imagenet)
    with pytest.raises(ValueError, match="CIFAR PreResNet.*ImageNet PreResNet"):
        conv.load_state_dict(kp.preact_resnet18(input_shape=(64, 64, 3)), state)


def test_a_failed_conversion_changes_no_variable():
    model = kp.preact_resnet20(first_shared_preact=False)
    before = [np.array(w) for w in model.weights]
    state = ref.state_dict_arrays(ref.pytorchcv_reference("preresnet20_cifar100"))
    with pytest.raises(ValueError, match="classes 10"):
        conv.load_state_dict(model, state)  # a 100-class head into a 10-class model
    assert all(np.array_equal(b, np.array(w)) for b, w in zip(before, model.weights))


def test_non_state_dict_files_are_refused_without_running_code(tmp_path):
    import pickle

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "evil.pth"
    with open(bad, "wb") as f:
        pickle.dump({"x": Payload()}, f)
    with pytest.raises(ValueError, match="Refusing to load .*global io.open"):
        conv.read_state_dict(str(bad))
    assert not marker.exists()
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        conv.read_state_dict(str(junk))


def _upstream_rows():
    path = os.path.join(os.path.dirname(pytorchcv.__file__), "models", "common",
                        "model_metainfos.csv")
    with open(path, newline="") as f:
        return {r["model_name"]: r for r in csv.DictReader(f)}


#: The ImageNet-1k models in the paper's layout (the "b" ones put the bottleneck
#: stride on the 3x3 conv; ResNet-200 is published only so).
IMAGENET_UPSTREAM = {"preresnet18", "preresnet34", "preresnet50", "preresnet101",
                     "preresnet152", "preresnet200b"}


PYTORCHCV_KEYS = sorted(k for k, e in catalog.load_catalog().items() if e.converter == "pytorchcv")


def test_catalog_lists_exactly_the_upstream_pairs():
    rows = _upstream_rows()
    published = {
        name for name, r in rows.items()
        if name.startswith("preresnet") and r["test_dataset"] == "cf"
        and r["checksum"] not in ("", "NA")
    }
    upstream = {catalog.get_entry(k).upstream_name for k in PYTORCHCV_KEYS}
    assert upstream == published | IMAGENET_UPSTREAM
    assert (catalog.get_entry("preact_resnet200.imagenet").architecture["bottleneck_stride"]
            == "middle")
    assert (catalog.get_entry("preact_resnet50.imagenet").architecture["bottleneck_stride"]
            == "first")
    # The published errors the docs quote.
    assert catalog.get_entry("preact_resnet110.cifar10").metrics.top1_error == 3.86
    assert catalog.get_entry("preact_resnet1001.cifar10").metrics.top1_error == 2.65
    assert catalog.get_entry("preact_resnet1001.cifar100").metrics.top1_error == 18.41


@pytest.mark.parametrize("key", PYTORCHCV_KEYS)
def test_catalog_entry_is_the_upstream_release(key):
    e = catalog.get_entry(key)
    r = _upstream_rows()[e.upstream_name]
    member = f"{e.upstream_name}-{r['error_value']}-{r['checksum'][:8]}.pth"
    assert e.hash == catalog.Hash("sha1", r["checksum"])
    assert e.archive_member == member
    assert e.url == (
        f"https://github.com/osmr/imgclsmob/releases/download/{r['repo_release_tag']}/{member}.zip"
    )
    assert e.params == int(r["net_weights"])
    metric = "top5_error" if e.dataset == "imagenet2012" else "top1_error"
    assert getattr(e.metrics, metric) == pytest.approx(int(r["error_value"]) / 100)
    assert e.converter_max_abs_diff is not None and e.converter_max_abs_diff <= BOUND
