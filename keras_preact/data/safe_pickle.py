"""A pickle reader for the CIFAR batch files that never runs code from the file: it admits
only the globals CIFAR batches use (`_ADMITTED`: numpy's array rebuilding and bytes), and
the result may hold only containers, strings, numbers and arrays of plain numeric dtypes."""

import io
import pickle

import numpy as np

from keras_preact.file_io import PickleRefused, RestrictedUnpickler, pickle_errors


_NDARRAY = object()  # what the pickle gets for ``numpy.ndarray``: not callable


def _reconstruct(subtype, shape, dtype):
    # numpy writes _reconstruct(ndarray, (0,), b"b"); the state that follows fills the array.
    if subtype is not _NDARRAY or shape != (0,):
        raise PickleRefused("_reconstruct may only start an empty numpy.ndarray")
    return np.ndarray(shape, dtype)


def _frombuffer(buffer, dtype, shape, order):
    if isinstance(buffer, pickle.PickleBuffer):
        buffer = buffer.raw()
    return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order).copy()


def _codecs_encode(text, encoding="utf-8", errors="strict"):
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise PickleRefused("_codecs.encode is only admitted as encode(str, 'latin1')")
    return text.encode("latin1")


def _empty_bytes(*args):
    if args:
        raise PickleRefused("bytes(...) is only admitted without arguments (the empty string)")
    return b""


# numpy.core (the original Python 2 files, protocols 2-4) and numpy._core (numpy >= 2);
# _frombuffer is protocol 5; _codecs.encode and bytes are how Python 3 writes ``bytes``
# at protocols 0-2.
_ADMITTED = {
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _frombuffer for core in ("core", "_core")},
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _codecs_encode,
    **{(module, "bytes"): _empty_bytes for module in ("__builtin__", "builtins")}}


def _check(obj, depth=0):
    """Raises PickleRefused for anything but containers, strings, numbers and numeric arrays."""
    if depth > 20:
        raise PickleRefused("nesting too deep for a CIFAR batch file")
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":  # bool, int, uint, float
            raise PickleRefused(f"an array of dtype {obj.dtype} (not a plain numeric dtype; "
                                "object and structured arrays are refused)")
    elif isinstance(obj, (dict, list, tuple)):
        for value in obj.items() if isinstance(obj, dict) else obj:
            _check(value, depth + 1)
    elif not (obj is None or type(obj) in (bool, int, float, str, bytes, bytearray)):
        raise PickleRefused(f"unexpected object of type {type(obj).__name__}")


def safe_load_pickle(data, *, source):
    """Unpickles CIFAR batch bytes `data` without importing or calling anything from the
    file; `source` names the file in error messages.

    Returns:
        dicts, lists, tuples, bytes (Python 2 strings too), str, numbers and numpy arrays
        of plain numeric dtypes.

    Raises ValueError for any other global or object, and for a truncated or corrupt pickle."""
    with pickle_errors(source):
        obj = RestrictedUnpickler(io.BytesIO(data), _ADMITTED, "a CIFAR batch file",
                                  encoding="bytes").load()
        _check(obj)
        return obj
