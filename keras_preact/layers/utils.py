"""Small argument, shape and cost helpers shared by the layers and models."""

import difflib
import warnings

import keras
import numpy as np

DATA_FORMATS = ("channels_last", "channels_first")


def normalize_data_format(data_format):
    """Returns a valid data format; None means `keras.config.image_data_format()`."""
    if data_format is None:
        return keras.config.image_data_format()
    if data_format not in DATA_FORMATS:
        raise ValueError(f"`data_format` must be one of {DATA_FORMATS} or None. "
                         f"Received: data_format={data_format!r}")
    return data_format


def check_choice(name, value, valid):
    """Raises ValueError unless `value` is one of `valid`; returns it."""
    if isinstance(value, (list, dict)) or value not in valid:
        raise ValueError(f"Unknown `{name}`. Received: {name}={value!r}. Valid: {list(valid)}")
    return value


def is_int(value, minimum=None):
    """Whether `value` is an integer (Python or NumPy, not a bool) of at least `minimum`."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    return ok and (minimum is None or value >= minimum)


def check_positive_int(name, value):
    """Raises ValueError unless `value` is an int >= 1 (not a bool)."""
    if not is_int(value, 1):
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def check_bool(name, value, *, allow_none=False):
    """Raises ValueError unless `value` is a bool (or None with `allow_none`)."""
    if not (isinstance(value, (bool, np.bool_)) or (allow_none and value is None)):
        either = "None, True or False" if allow_none else "True or False"
        raise ValueError(f"`{name}` must be {either}. Received: {name}={value!r}")


def check_known_arguments(given, valid, *, where):
    """Raises ValueError, with the closest valid name, for the first name of the
    kwargs dict `given` not in `valid`; `where` names the receiver (e.g. "preact_resnet20")."""
    valid = sorted(valid)
    for name in sorted(set(given) - set(valid)):
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        raise ValueError(f"Unknown argument `{name}` for {where}.{hint} Received: "
                         f"{name}={given[name]!r}. Valid: {', '.join(valid)}")


def warn_deprecated(old, new, where):
    """Warns that `old` of `where` is now `new` (a FutureWarning: users see it by default)."""
    warnings.warn(f"`{old}` of {where} is deprecated and will be removed in the next "
                  f"release; use `{new}`.", FutureWarning, stacklevel=3)


def deprecated_alias(old, new, where):
    """A read-only property `old` that returns attribute `new`, warning."""

    def get(self):
        warn_deprecated(old, new, where)
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of `{new}`.")


def pop_deprecated(kwargs, old, new, where):
    """Pops the deprecated argument `old` from `kwargs` (None when absent), warning."""
    if old in kwargs:
        warn_deprecated(old, new, where)
    return kwargs.pop(old, None)


def spatial_shape(shape, data_format):
    return (shape[1], shape[2]) if data_format == "channels_last" else (shape[2], shape[3])


def conv_macs(conv, input_shape, data_format):
    """Multiply-adds of a built `keras.layers.Conv2D` for one example of 4D `input_shape`."""
    height, width = spatial_shape(input_shape, data_format)
    if height is None or width is None:
        raise ValueError(f"Multiply-adds need a fixed input size. Received: input_shape="
                         f"{tuple(input_shape)}")
    (sh, sw), (kh, kw) = conv.strides, conv.kernel_size
    if conv.padding == "same":
        out_h, out_w = -(-height // sh), -(-width // sw)
    else:
        # Our strided convs are fed a symmetric (k - 1) // 2 padding before the conv.
        pad_h = (kh - 1) // 2 * 2 if sh > 1 else 0
        pad_w = (kw - 1) // 2 * 2 if sw > 1 else 0
        out_h = (height + pad_h - kh) // sh + 1
        out_w = (width + pad_w - kw) // sw + 1
    return int(out_h * out_w * kh * kw * conv.kernel.shape[2] * conv.filters)
