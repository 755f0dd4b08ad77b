"""keras-preact: pre-activation ResNets (He et al. 2016) for Keras 3.

Works on the TensorFlow, JAX and PyTorch backends; importing it does not import
TensorFlow (TF-only modules import it lazily).

Example:
    >>> import keras_preact
    >>> model = keras_preact.preact_resnet110(classes=10)
    >>> keras_preact.list_models()[:3]
    ['preact_resnet20', 'preact_resnet32', 'preact_resnet44']
"""

__version__ = "0.1.0"

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
