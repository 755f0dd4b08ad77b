"""Models: the config-driven `PreActResNet`, the named factories and the registry."""

from keras_preact.models.cifar import cifar_units_per_stage
from keras_preact.models.cifar import preact_resnet20
from keras_preact.models.cifar import preact_resnet32
from keras_preact.models.cifar import preact_resnet44
from keras_preact.models.cifar import preact_resnet56
from keras_preact.models.cifar import preact_resnet110
from keras_preact.models.cifar import preact_resnet164
from keras_preact.models.cifar import preact_resnet272
from keras_preact.models.cifar import preact_resnet542
from keras_preact.models.cifar import preact_resnet1001
from keras_preact.models.cifar import preact_resnet1202
from keras_preact.models.cifar import preact_resnet_cifar
from keras_preact.models.imagenet import preact_resnet18
from keras_preact.models.imagenet import preact_resnet34
from keras_preact.models.imagenet import preact_resnet50
from keras_preact.models.imagenet import preact_resnet101
from keras_preact.models.imagenet import preact_resnet152
from keras_preact.models.imagenet import preact_resnet200
from keras_preact.models.imagenet import preact_resnet_imagenet
from keras_preact.models.costs import count_macs
from keras_preact.models.costs import count_params
from keras_preact.models.preact_resnet import PreActResNet
from keras_preact.models.registry import get_model
from keras_preact.models.registry import list_models
from keras_preact.models.registry import model_info
from keras_preact.models.registry import register_model
