"""`read_state_dict`, the NumPy reader of PyTorch checkpoints: files written by the real
`torch.save` in both formats (zip and legacy) read to the arrays torch has, without importing
torch; pickles that would run code and truncated files refused in one line; the pytorchcv
converter and `keras-preact weights convert` with torch blocked, checked against pytorchcv's
own model. Needs torch (to write the files) and pytorchcv
(``pip install --no-deps pytorchcv==0.0.74``) for the reference models."""

import collections
import hashlib
import os
import zipfile

import numpy as np
import pytest

from keras_preact.weights import read_state_dict
from tests.helpers import NO_TENSORFLOW, run_cli, run_python

torch = pytest.importorskip("torch", reason="the torch extra: pip install 'keras-preact[torch]'")

BOUND = 1e-4  # the largest allowed logit difference, as the pytorchcv converter tests
FORMATS = {"zip": {}, "legacy": {"_use_new_zipfile_serialization": False}}


def _save(obj, path, fmt):
    torch.save(obj, str(path), **FORMATS[fmt])
    return str(path)


def _numpy(tensor):
    tensor = tensor.detach()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _views_and_dtypes():
    """A state dict of every storage type read, views of one storage among them."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    half = torch.randn(4, 5, generator=g).half()
    return collections.OrderedDict(
        base=base, transposed=base.t(), rows=base[2:5], block=base[1:4, 3:7],
        every_other=base[:, ::2], offset_flat=base.view(-1)[11:30],
        half=half, half_t=half.t(),
        bfloat16=torch.randn(3, 7, generator=g).to(torch.bfloat16),
        bfloat16_view=torch.randn(5, 4, generator=g).to(torch.bfloat16)[1:, 1:].t(),
        double=torch.randn(3, generator=g, dtype=torch.float64),
        int64=torch.arange(-5, 7), int32=torch.arange(9, dtype=torch.int32).reshape(3, 3).t(),
        uint8=torch.arange(250, 256, dtype=torch.uint8), bool=torch.tensor([True, False, True]),
        scalar=torch.tensor(2.5), empty=torch.zeros(0, 3),
        parameter=torch.nn.Parameter(torch.randn(2, 3, generator=g)))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_views_dtypes_and_shared_storages_read_as_torch_has_them(fmt, tmp_path):
    state = _views_and_dtypes()
    path = _save(state, tmp_path / "state.pth", fmt)
    if fmt == "zip":  # one storage record per storage: the views really share theirs
        with zipfile.ZipFile(path) as z:
            records = [n for n in z.namelist() if "/data/" in n]
        assert len(records) == len(state) - 6
    got = read_state_dict(path)
    assert list(got) == list(state)
    for name, tensor in state.items():
        want = _numpy(tensor)
        assert got[name].dtype == want.dtype, name
        assert got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    # A copy, not a view: changing one array changes no other on the same storage.
    got["base"][0, 0] += 1
    assert got["transposed"][0, 0] == _numpy(state["base"])[0, 0]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_training_checkpoint_gives_its_state_dict(fmt, tmp_path):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    path = _save({"epoch": 3, "state_dict": net.state_dict(), "best": 0.5}, tmp_path / "c.pth",
                 fmt)
    got = read_state_dict(path)
    assert sorted(got) == sorted(net.state_dict())
    assert got["1.num_batches_tracked"].dtype == np.int64
    np.testing.assert_array_equal(got["0.weight"], net[0].weight.detach().numpy())


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(fmt, tmp_path):
    marker = tmp_path / "SOMEFILE"
    path = _save({"w": torch.ones(2), "x": _RunsCode(marker)}, tmp_path / "evil.pth", fmt)
    with pytest.raises(ValueError) as err:
        read_state_dict(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"Refusing to load the pickle file {path!r}: the pickle asks for "
                              f"the global {os.system.__module__}.system")
    assert not marker.exists()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("where", [0.1, 0.5, 0.98])
def test_a_truncated_file_is_refused_in_one_line(fmt, where, tmp_path):
    state = {"w": torch.randn(64, 64), "b": torch.arange(10)}
    path = _save(state, tmp_path / "cut.pth", fmt)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:int(len(data) * where)])
    with pytest.raises(ValueError, match=r"^The pickle file .*cut\.pth' is truncated or "
                       r"corrupt \(") as err:
        read_state_dict(path)
    assert "\n" not in str(err.value)


def test_corrupt_and_foreign_files_are_refused_in_one_line(tmp_path):
    path = _save({"w": torch.randn(32, 32)}, tmp_path / "flip.pth", "zip")
    data = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as z:  # a bit flipped inside the storage: its CRC fails
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + 100] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="truncated or corrupt .*CRC"):
        read_state_dict(path)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_state_dict(str(junk))
    tensor = _save(torch.ones(3), tmp_path / "tensor.pth", "zip")
    with pytest.raises(ValueError, match="Refusing to load .*holds no state dict"):
        read_state_dict(tensor)


# The converter and the command, with torch blocked, against pytorchcv's own model.

def _reference(tmp_path):
    """A pytorchcv ResNet-20 (random weights and statistics), its checkpoint in both
    formats, test images and its logits for them."""
    pytest.importorskip("pytorchcv", reason="pip install --no-deps pytorchcv==0.0.74")
    from tests import references as ref

    net = ref.pytorchcv_reference("preresnet20_cifar10", seed=0)
    files = {fmt: _save(net.state_dict(), tmp_path / f"r20_{fmt}.pth", fmt) for fmt in FORMATS}
    x = np.random.RandomState(1).randn(2, 32, 32, 3).astype("float32")
    return files, x, ref.reference_logits(net, x)


def _logits(weights, x):
    import keras_preact as kp

    model = kp.preact_resnet20(weights=weights, classifier_activation=None)
    return np.asarray(model(x, training=False))


#: The head of a script in which `import torch` fails, as where torch is not installed.
_NO_TORCH = NO_TENSORFLOW.replace("tensorflow", "torch").replace("_NoTensorFlow", "_NoTorch")


def test_converter_and_catalog_path_need_no_torch(tmp_path):
    files, x, want = _reference(tmp_path)
    # The catalog route (`weights="cifar10"`): a published-style zip, hash-checked.
    member = "preresnet20_cifar10-0000-00000000.pth"
    with zipfile.ZipFile(tmp_path / (member + ".zip"), "w") as z:
        z.write(files["zip"], arcname=member)
    sha1 = hashlib.sha1(open(files["zip"], "rb").read()).hexdigest()
    entry = {"model": "preact_resnet20", "tag": "mine", "converter": "pytorchcv",
             "url": f"file://{tmp_path / (member + '.zip')}", "hash": f"sha1:{sha1}",
             "archive_member": member, "architecture": {"first_shared_preact": False}}
    code = _NO_TORCH + f"""
import keras_preact as kp
from keras_preact.weights import convert_checkpoint, fetch_weights
print(fetch_weights({entry!r}, build=kp.get_model, cache_dir={str(tmp_path)!r},
                    progress=False))
convert_checkpoint({files["legacy"]!r}, {str(tmp_path / "legacy.weights.h5")!r},
                   model="preact_resnet20", build=kp.get_model)
assert not any(m.split(".")[0] == "torch" for m in sys.modules)
"""
    result = run_python(code, env={"KERAS_BACKEND": "tensorflow"})
    assert result.returncode == 0, result.stderr[-3000:]
    cached = result.stdout.strip().splitlines()[-1]
    for path in (cached, str(tmp_path / "legacy.weights.h5")):
        assert float(np.abs(_logits(path, x) - want).max()) <= BOUND


def test_cli_convert_end_to_end(tmp_path, capsys):
    files, x, want = _reference(tmp_path)
    out = str(tmp_path / "mine.weights.h5")
    argv = ["weights", "convert", files["zip"], "--model", "preact_resnet20", "--out", out]
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    assert stdout == f"{files['zip']}: {out} (weights={out!r} loads it)\n"
    assert float(np.abs(_logits(out, x) - want).max()) <= BOUND

    # An existing --out is kept unless --overwrite says otherwise.
    code, _, stderr = run_cli(argv, capsys)
    assert (code, stderr) == (2, f"error: {out} exists; pass overwrite=True (--overwrite) to "
                                 f"replace it. Received: out={out!r}\n")
    assert run_cli(argv + ["--overwrite"], capsys)[0] == 0
    # Another depth: the first tensors the model misses are named; nothing is written.
    other = str(tmp_path / "r56.weights.h5")
    code, _, stderr = run_cli(["weights", "convert", files["legacy"], "--model",
                               "preact_resnet56", "--out", other], capsys)
    assert code == 2 and stderr.count("\n") == 1
    assert "tensors missing from the file, e.g. ['features.stage1.unit4." in stderr
    assert not os.path.exists(other)
    # A 10-class checkpoint into a 100-class head: the head's shapes are named.
    code, _, stderr = run_cli(["weights", "convert", files["zip"], "--model", "preact_resnet20",
                               "--classes", "100", "--out", other], capsys)
    assert code == 2 and "output.weight: file (64, 10), model (64, 100)" in stderr
    # A missing file, a model without a pytorchcv layout, a name that is not .weights.h5.
    missing = str(tmp_path / "nope.pth")
    for args, text in (
            ([missing, "--model", "preact_resnet20"],
             f"error: No such file or directory: {missing!r} (check the path)\n"),
            ([files["zip"], "--model", "preact_resnet32"],
             "error: No pytorchcv layout is known for the model. Received: "
             "model='preact_resnet32'. Valid: ["),
            ([files["zip"], "--model", "preact_resnet20", "--converter", "onnx"],
             "error: Unknown weights converter. Received: converter='onnx'. Valid: [")):
        code, _, stderr = run_cli(["weights", "convert", *args, "--out", other], capsys)
        assert code == 2 and stderr.startswith(text) and stderr.count("\n") == 1, stderr
    code, _, stderr = run_cli(["weights", "convert", files["zip"], "--model", "preact_resnet20",
                               "--out", str(tmp_path / "x.h5")], capsys)
    assert code == 2 and "must end in '.weights.h5'" in stderr
