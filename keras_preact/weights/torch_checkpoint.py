"""PyTorch checkpoints read as numpy arrays without torch and without running code from the
file. Both formats of ``torch.save`` are read, as torch's serialization notes
(https://pytorch.org/docs/stable/notes/serialization.html) and ``torch/serialization.py``
write them:

- zip (torch >= 1.6): ``<archive>/data.pkl`` pickles the object and each storage is the
  raw record ``<archive>/data/<key>``, in the byte order ``<archive>/byteorder`` names
  (little-endian without it);
- legacy: pickles of a magic number, the protocol version and the system's facts, then
  of the object, then of the list of storage keys; then, per key, an int64 element count
  and the storage's little-endian bytes.

In the object's pickle a tensor is ``torch._utils._rebuild_tensor_v2(storage, offset,
size, stride, ...)`` and a storage the persistent id ``("storage", torch.FloatStorage,
key, location, numel[, view])``. The restricted unpickler admits these globals (rebuilt as
references to storages: nothing of torch's is called), ``_rebuild_parameter`` and
``collections.OrderedDict``, nothing else."""

import collections
import os
import zipfile

import numpy as np

from keras_preact.checks import is_int
from keras_preact.file_io import PickleRefused, RestrictedUnpickler, pickle_errors

WHAT = "a PyTorch state dict"
#: torch's typed storages -> numpy dtype of their elements (bfloat16 as its uint16 bits).
STORAGE_DTYPES = {f"{name}Storage": np.dtype(code) for name, code in zip(
    "Float Half BFloat16 Double Long Int Short Char Byte Bool".split(),
    "f4 f2 u2 f8 i8 i4 i2 i1 u1 ?".split())}
#: The first two pickles of a legacy file: torch's magic number and protocol version.
LEGACY_HEADER = [0x1950A86A20F9469CFC6C, 1001]
_Storage = collections.namedtuple("_Storage", "key type numel")
_Tensor = collections.namedtuple("_Tensor", "key offset size stride")


def _rebuild_tensor(storage, offset, size, stride, *_):
    # The rest (requires_grad, hooks, metadata) is torch's bookkeeping.
    if not (isinstance(storage, _Storage) and isinstance(size, tuple) and len(size) == len(
            stride) and all(is_int(n, 0) for n in (offset, *size, *stride))):
        raise ValueError("a tensor of malformed storage, offset, size or stride")
    return _Tensor(storage.key, offset, size, tuple(stride))


# A parameter is its tensor (`read_state_dict` checks that it is one), plus bookkeeping.
_ADMITTED = {("collections", "OrderedDict"): collections.OrderedDict,
             **{("torch", name): name for name in STORAGE_DTYPES},
             **{("torch._utils", f"_rebuild_tensor{v}"): _rebuild_tensor for v in ("", "_v2")},
             **{("torch._utils", f"_rebuild_parameter{v}"): lambda data, *_: data
                for v in ("", "_with_state")}}


def _load_object(file, storages):
    """The object pickled in `file`; `storages` collects key -> `_Storage` from its ids."""
    def persistent_load(pid):
        kind, storage_type, key, _, numel, *view = pid  # the last two: numel, old torch's view
        if not (kind == "storage" and storage_type in STORAGE_DTYPES and is_int(numel, 0)
                and isinstance(key, str) and view in ([], [None])):
            raise PickleRefused(f"the persistent id {str(pid)[:100]} is not a tensor storage")
        # Two tensors on one storage (views, tied weights) share it.
        return storages.setdefault(key, _Storage(key, storage_type, numel))
    return RestrictedUnpickler(file, _ADMITTED, WHAT, persistent_load).load()


def _decode(raw, storage, byteorder="<"):
    """A storage's bytes as a flat native array (bfloat16 widened to float32)."""
    dtype = STORAGE_DTYPES[storage.type].newbyteorder(byteorder)
    if len(raw) != storage.numel * dtype.itemsize:
        raise ValueError(f"storage {storage.key} holds {len(raw)} bytes, not {storage.numel} "
                         f"elements of {dtype.itemsize}")
    flat = np.frombuffer(raw, dtype)
    # bfloat16 is the upper half of a float32
    return ((flat.astype(np.uint32) << 16).view(np.float32) if storage.type == "BFloat16Storage"
            else flat.astype(dtype.newbyteorder("=")))


def _read_zip(file):
    with zipfile.ZipFile(file) as archive:
        names = archive.namelist()
        # One <archive>/data.pkl (else a ValueError: a corrupt file).
        (pickled,) = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
        prefix, storages = pickled[:-len("data.pkl")], {}
        obj = _load_object(archive.open(pickled), storages)
        order = archive.read(prefix + "byteorder") if prefix + "byteorder" in names else b"little"
        return obj, {key: _decode(archive.read(f"{prefix}data/{key}"), storage,
                                  {b"little": "<", b"big": ">"}[order])
                     for key, storage in storages.items()}


def _read_legacy(f):
    if [RestrictedUnpickler(f, {}, WHAT).load() for _ in range(3)][:2] != LEGACY_HEADER:
        raise ValueError("neither a zip nor torch's legacy format (no magic number)")
    obj = _load_object(f, storages := {})
    # The storage keys, then their bytes, sliced: a corrupt element count allocates nothing.
    keys, rest, at, buffers = RestrictedUnpickler(f, {}, WHAT).load(), memoryview(f.read()), 0, {}
    for storage in (storages[key] for key in keys):
        size = int.from_bytes(rest[at:at + 8], "little") * STORAGE_DTYPES[storage.type].itemsize
        buffers[storage.key] = _decode(rest[at + 8:at + 8 + size], storage)
        at += 8 + size
    return obj, buffers


def _array(tensor, buffers):
    """A tensor as a copy of its (strided, offset) view of the storage's flat array."""
    flat = buffers[tensor.key]
    last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride))
    if last >= flat.size and 0 not in tensor.size:
        raise ValueError(f"a tensor reaches element {last} of a storage of {flat.size}")
    return np.lib.stride_tricks.as_strided(
        flat[tensor.offset:], tensor.size, [s * flat.itemsize for s in tensor.stride]).copy()


def read_state_dict(path):
    """Reads the state dict of a PyTorch checkpoint as numpy arrays, without torch.

    Args:
        path: a file ``torch.save`` wrote, in the zip or the legacy format, holding a state
            dict (names -> tensors) or a dict holding one under "state_dict".

    Returns:
        dict name -> numpy array, in the file's order (bfloat16 tensors as float32).

    Raises:
        OSError: the file cannot be opened.
        ValueError: one line naming the file, for a pickle that asks for anything but
            tensors, their storages and ordered dicts (nothing of it is run), a truncated
            or corrupt file, or one that holds no state dict."""
    path = os.fspath(path)
    with open(path, "rb") as f, pickle_errors(path):
        zipped = f.read(4) == b"PK\x03\x04"
        f.seek(0)
        obj, buffers = _read_zip(f) if zipped else _read_legacy(f)
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
        if not (isinstance(obj, dict) and obj and all(
                isinstance(k, str) and isinstance(v, _Tensor) for k, v in obj.items())):
            raise PickleRefused("it holds no state dict (a mapping of names to tensors)")
        return {name: _array(tensor, buffers) for name, tensor in obj.items()}
