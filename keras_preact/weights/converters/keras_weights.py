"""Converter for published files that already are keras-preact `.weights.h5` files."""


def convert(source_path, model, entry):
    """Loads the file into `model` after checking its layout."""
    from keras_preact.weights.local import load_weights_file

    load_weights_file(model, source_path)
    return {"converted_tensors": len(model.weights)}
