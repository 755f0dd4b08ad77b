"""Converter for published files that already are keras-preact `.weights.h5` files."""


def convert(source_path, model, entry):
    """Loads a keras-preact `.weights.h5` into `model`, checking its layout first.

    Args:
        source_path: the verified published `.weights.h5`.
        model: the model built from the entry's architecture.
        entry: the catalog entry (unused: nothing to configure).

    Returns:
        {"converted_tensors": number of variables loaded}.

    Raises:
        ValueError: if the file holds another architecture (nothing is loaded).
    """
    from keras_preact.weights.local import load_weights_file

    load_weights_file(model, source_path)
    return {"converted_tensors": len(model.weights)}
