"""Data-format, shape and cost helpers shared by the layers and models."""

import keras

DATA_FORMATS = ("channels_last", "channels_first")


def normalize_data_format(data_format):
    """Returns a valid data format; None means `keras.config.image_data_format()`."""
    if data_format is None:
        return keras.config.image_data_format()
    if data_format not in DATA_FORMATS:
        raise ValueError(f"`data_format` must be one of {DATA_FORMATS} or None. "
                         f"Received: data_format={data_format!r}")
    return data_format


def spatial_shape(shape, data_format):
    return (shape[1], shape[2]) if data_format == "channels_last" else (shape[2], shape[3])


def conv_macs(conv, input_shape, data_format):
    """Multiply-adds of a built `keras.layers.Conv2D` for one example of 4D `input_shape`."""
    height, width = spatial_shape(input_shape, data_format)
    if height is None or width is None:
        raise ValueError(f"Multiply-adds need a fixed input size. Received: input_shape="
                         f"{tuple(input_shape)}")
    macs = conv.kernel.shape[2] * conv.filters
    for size, s, k in zip((height, width), conv.strides, conv.kernel_size):
        # Our strided "valid" convs are fed a symmetric (k - 1) // 2 padding first.
        pad = (k - 1) // 2 * 2 if s > 1 else 0
        macs *= k * (-(-size // s) if conv.padding == "same" else (size + pad - k) // s + 1)
    return int(macs)
