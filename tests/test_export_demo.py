"""The demo's export step: a trained `.keras` model in a run folder becomes a
SavedModel whose serving signature reproduces it."""

import json

import numpy as np


def test_export_demo_writes_a_serving_export_with_metrics(tmp_path):
    import tensorflow as tf

    import keras_preact as kp
    from keras_preact.training.demo import export_demo

    model = kp.PreActResNet(stage_blocks=(1, 1, 1), stage_filters=(8, 16, 32), stem_filters=8,
                            input_shape=(32, 32, 3), preprocessing="unit")
    model_path = str(tmp_path / "model.keras")
    model.save(model_path)
    # What a training run writes beside its model.
    (tmp_path / "config.json").write_text(json.dumps({"train_config": {"dataset": "digits"}}))
    (tmp_path / "metrics.json").write_text(json.dumps({"test_accuracy": 0.975, "test_loss": 0.1}))
    written = export_demo(workdir=str(tmp_path), model_path=model_path)
    folder = written["saved_model"]
    card = json.loads((tmp_path / "export" / "saved_model" / "1" / "model_card.json").read_text())
    assert "0.975" in json.dumps(card)
    images = np.random.RandomState(0).randint(0, 256, (3, 32, 32, 3)).astype("uint8")
    served = tf.saved_model.load(folder).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(
        served["probabilities"].numpy(), model.predict(images.astype("float32"), verbose=0), atol=1e-5
    )
    # A rerun of the demo replaces its own export.
    export_demo(workdir=str(tmp_path), model_path=model_path)
