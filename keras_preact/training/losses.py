"""The recipe's loss and metric: `compile_model`, with the label-smoothed cross-entropy
`SmoothedCrossentropy`, which `model.keras` files record. Keras is told of it whenever Keras
is imported (`keras_preact/__init__.py`), so those files load with `keras.saving.load_model`
after ``import keras_preact``; files written before it moved here name the module
``keras_preact.training.run``, and Keras finds the class by its registered name."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_preact")
class SmoothedCrossentropy(keras.losses.Loss):
    """Cross-entropy of integer labels against probabilities, the one-hot targets smoothed
    by `label_smoothing` (Szegedy et al. 2016)."""

    def __init__(self, label_smoothing=0.1, name="smoothed_crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        targets = ops.one_hot(ops.reshape(ops.cast(y_true, "int32"), (-1,)),
                              ops.shape(y_pred)[-1], dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(targets, y_pred,
                                                     label_smoothing=self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def compile_model(model, optimizer, label_smoothing=0.0, **kwargs):
    """Compiles with the recipe's loss (label-smoothed with `label_smoothing`) and accuracy."""
    loss = (SmoothedCrossentropy(label_smoothing) if label_smoothing
            else keras.losses.SparseCategoricalCrossentropy())
    model.compile(optimizer=optimizer, loss=loss,
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], **kwargs)
