"""Models: the config-driven `PreActResNet`, the named factories and the registry."""

from keras_preact.models.cifar import (
    cifar_units_per_stage, preact_resnet1001, preact_resnet110, preact_resnet1202,
    preact_resnet164, preact_resnet20, preact_resnet272, preact_resnet32, preact_resnet44,
    preact_resnet542, preact_resnet56, preact_resnet_cifar)
from keras_preact.models.imagenet import (
    preact_resnet101, preact_resnet152, preact_resnet18, preact_resnet200, preact_resnet34,
    preact_resnet50, preact_resnet_imagenet)
from keras_preact.models.costs import count_macs, count_params
from keras_preact.models.preact_resnet import PreActResNet
from keras_preact.models.registry import get_model, list_models, model_info, register_model
