"""keras-preact: pre-activation ResNets (He et al. 2016) for Keras 3.

Works on the TensorFlow, JAX and PyTorch backends; importing it does not import
TensorFlow (TF-only modules import it lazily).

Imported before TensorFlow, it sets `TF_ENABLE_ONEDNN_OPTS=1` unless that variable is
already set: TensorFlow's oneDNN CPU kernels, which it enables by itself only on CPUs
with AVX-512/AMX features, trained ResNet-110 1.5-1.9x faster on an AVX2 CPU. Set
`TF_ENABLE_ONEDNN_OPTS=0` to keep TensorFlow's Eigen kernels.

Example:
    >>> import keras_preact
    >>> model = keras_preact.preact_resnet110(classes=10)
    >>> keras_preact.list_models()[:3]
    ['preact_resnet20', 'preact_resnet32', 'preact_resnet44']
"""

__version__ = "0.1.0"

import os as _os
import sys as _sys

# TensorFlow runs its oneDNN CPU kernels by default only on CPUs with AVX-512/AMX
# features. On an AVX2 CPU they trained ResNet-110 1.5-1.9x faster than its Eigen
# kernels (README, "Performance"), so unless the environment says otherwise they are
# turned on here. TensorFlow reads the switch once, when it is imported: this works
# only when keras_preact is imported before TensorFlow (or Keras on that backend).
# `TF_ENABLE_ONEDNN_OPTS=0` keeps the Eigen kernels.
if "tensorflow" not in _sys.modules:
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from keras_preact import finetune
from keras_preact import layers
from keras_preact import models
from keras_preact import weights
from keras_preact.models import PreActResNet
from keras_preact.models import count_macs
from keras_preact.models import count_params
from keras_preact.models import get_model
from keras_preact.models import list_models
from keras_preact.models import model_info
from keras_preact.models import preact_resnet20
from keras_preact.models import preact_resnet32
from keras_preact.models import preact_resnet44
from keras_preact.models import preact_resnet56
from keras_preact.models import preact_resnet110
from keras_preact.models import preact_resnet164
from keras_preact.models import preact_resnet272
from keras_preact.models import preact_resnet542
from keras_preact.models import preact_resnet1001
from keras_preact.models import preact_resnet1202
from keras_preact.models import preact_resnet_cifar
from keras_preact.models import preact_resnet18
from keras_preact.models import preact_resnet34
from keras_preact.models import preact_resnet50
from keras_preact.models import preact_resnet101
from keras_preact.models import preact_resnet152
from keras_preact.models import preact_resnet200
from keras_preact.models import preact_resnet_imagenet
from keras_preact.models import register_model
