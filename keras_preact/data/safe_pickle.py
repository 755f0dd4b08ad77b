"""A pickle reader for the CIFAR batch files that never runs code from the file: only the
globals CIFAR batches use are admitted (`_ADMITTED`), as inert stand-ins, and arrays of plain
numeric dtypes are rebuilt from the validated bytes; anything else raises ValueError."""

import io
import math
import pickle

import numpy as np


class _Refused(Exception):
    """Raised inside the unpickler; turned into a ValueError naming the file."""


def _ndarray(*args, **kwargs):
    """Stands for the ``numpy.ndarray`` class; only usable as `_reconstruct`'s argument."""
    raise _Refused("numpy.ndarray may not be called directly")


def _ascii(value):
    return value.decode("ascii", errors="replace") if isinstance(value, bytes) else value


class _DtypeSpec:
    """What ``numpy.dtype(code, align, copy)`` plus its pickled state described."""

    code = None  # Also the state of an instance made without __init__ (NEWOBJ).
    byteorder = "|"

    def __init__(self, code, align=False, copy=False):
        del align, copy  # Irrelevant for the plain numeric dtypes accepted.
        code = _ascii(code)
        if not isinstance(code, str):
            raise _Refused(f"numpy.dtype({code!r}) is not a plain dtype code")
        self.code = code

    def __setstate__(self, state):
        # numpy writes (version, byteorder, subarray, names, fields, elsize, alignment,
        # flags); anything but a flat dtype (no subarray, no fields) is refused.
        if not isinstance(state, tuple) or len(state) < 5:
            raise _Refused(f"unexpected numpy.dtype state {state!r}")
        byteorder = _ascii(state[1])
        if byteorder not in ("|", "<", ">", "="):
            raise _Refused(f"unexpected dtype byte order {byteorder!r}")
        if any(part is not None for part in state[2:5]):
            raise _Refused("structured or sub-array dtypes are not allowed")
        self.byteorder = byteorder

    def to_numpy(self):
        if not isinstance(self.code, str):
            raise _Refused("a numpy.dtype without a type code")
        try:
            dtype = np.dtype(self.code)
        except (TypeError, ValueError):
            raise _Refused(f"unknown dtype code {self.code!r}") from None
        if dtype.kind not in "biuf" or dtype.fields is not None:  # bool, int, uint, float
            raise _Refused(f"dtype {dtype} is not a plain numeric dtype")
        if self.byteorder in ("<", ">"):
            dtype = dtype.newbyteorder(self.byteorder)
        return dtype


class _ArraySpec:
    """What ``_reconstruct(ndarray, ...)`` / ``_frombuffer`` plus state described."""

    dtype = None

    def __setstate__(self, state):
        # (version, shape, dtype, is_fortran, data); older numpy omits the version.
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]
        if not isinstance(state, tuple) or len(state) != 4:
            raise _Refused("unexpected numpy.ndarray state")
        shape, dtype, fortran, data = state
        self.set(shape, dtype, bool(fortran), data)

    def set(self, shape, dtype, fortran, data):
        if not isinstance(dtype, _DtypeSpec):
            raise _Refused("array dtype is not a numpy.dtype")
        if not isinstance(shape, tuple) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise _Refused(f"invalid array shape {shape!r}")
        if isinstance(data, str):  # a Python 2 str a caller decoded as latin1: undone
            data = data.encode("latin1")
        if not isinstance(data, (bytes, bytearray)):  # object arrays store a list here
            raise _Refused("array data is not raw bytes (object arrays are refused)")
        self.shape, self.dtype, self.fortran, self.data = shape, dtype, fortran, data
        return self

    def to_numpy(self):
        if self.dtype is None:
            raise _Refused("an array without state")
        dtype = self.dtype.to_numpy()
        count = math.prod(self.shape)  # Exact: no int64 wrap-around on huge shapes.
        if len(self.data) != count * dtype.itemsize:
            raise _Refused(f"array of shape {self.shape} and dtype {dtype} needs "
                           f"{count * dtype.itemsize} bytes, the file holds {len(self.data)}")
        flat = np.frombuffer(self.data, dtype=dtype, count=count)
        return flat.reshape(self.shape, order="F" if self.fortran else "C").copy()


def _reconstruct(subtype, shape, dtype_code):
    # numpy passes (0,) and b"b" as shape and dtype_code; the state carries the array.
    if subtype is not _ndarray:
        raise _Refused("_reconstruct may only rebuild numpy.ndarray")
    return _ArraySpec()


def _frombuffer(buffer, dtype, shape, order):
    if isinstance(buffer, pickle.PickleBuffer):
        buffer = bytes(buffer.raw())
    return _ArraySpec().set(shape, dtype, order == "F", buffer)


def _codecs_encode(text, encoding="utf-8", errors="strict"):
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("_codecs.encode is only admitted as encode(str, 'latin1')")
    return text.encode("latin1")


def _empty_bytes(*args):
    if args:
        raise _Refused("bytes(...) is only admitted without arguments (the empty string)")
    return b""


# numpy.core (the original Python 2 files, protocols 2-4) and numpy._core (numpy >= 2);
# _frombuffer is protocol 5; _codecs.encode and bytes are how Python 3 writes ``bytes``
# at protocols 0-2.
_ADMITTED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _ndarray,
    ("numpy", "dtype"): _DtypeSpec,
    ("_codecs", "encode"): _codecs_encode,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ADMITTED:
            raise _Refused(f"the pickle asks for the global {module}.{name}, which a CIFAR "
                           "batch file never needs (it would let the file run code)")
        return _ADMITTED[(module, name)]

    def persistent_load(self, pid):
        raise _Refused("persistent ids are not allowed")


def _materialize(obj, depth=0):
    """Replaces the inert array stand-ins by numpy arrays, recursively."""
    if depth > 20:
        raise _Refused("nesting too deep for a CIFAR batch file")
    if isinstance(obj, _ArraySpec):
        return obj.to_numpy()
    if obj is _ndarray or isinstance(obj, _DtypeSpec):
        raise _Refused("a bare numpy.dtype or numpy.ndarray object")
    if isinstance(obj, dict):
        return {_materialize(k, depth + 1): _materialize(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):  # only the built-in types: the pickle names no class
        return type(obj)(_materialize(v, depth + 1) for v in obj)
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, bytearray)):
        return obj
    raise _Refused(f"unexpected object of type {type(obj).__name__}")


def safe_load_pickle(data, *, source):
    """Unpickles CIFAR batch bytes `data` without importing or calling anything from the
    file; `source` names the file in error messages.

    Returns:
        dicts, lists, tuples, bytes (Python 2 strings too), str, numbers and numpy arrays
        of plain numeric dtypes.

    Raises ValueError for any other global or object, and for a truncated or corrupt pickle."""
    try:
        return _materialize(_RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load())
    except _Refused as err:
        raise ValueError(f"Refusing to load the pickle file {source!r}: {err}.") from None
    except RecursionError:
        raise ValueError(f"Refusing to load the pickle file {source!r}: nesting too "
                         "deep.") from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file.
        raise ValueError(f"The pickle file {source!r} is truncated or corrupt "
                         f"({type(err).__name__}: {err}).") from None
