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
