"""The residual units compared in He et al. 2016 (arXiv 1603.05027), by name.

Every unit is ``y = f(h(x) + F(x))`` with a different placement of BN and ReLU
(paper Section 4, Fig. 4, Table 2) or a different shortcut ``h`` (Section 3, Fig. 2,
Table 1). A name selects one; `resolve_unit_options` checks the name and its
parameters and fills in the paper's values where a parameter is left as None.

==========================  ======  ===============================================
name                        figure  equation (``F`` = the residual branch)
==========================  ======  ===============================================
``full_preact`` (default)   4e      ``x + F(x)``, F = (BN-ReLU-conv) x 2 or 3
``original``                4a      ``relu(x + F(x))``, F = conv-BN-ReLU-...-conv-BN
``bn_after_addition``       4b      ``relu(BN(x + F(x)))``, F's last BN removed
``relu_before_addition``    4c      ``x + relu(F(x))``, F as in ``original``
``relu_only_preact``        4d      ``x + F(x)``, F = (ReLU-conv-BN) x 2 or 3
``constant_scaling``        2b      ``relu(lambda_s * x + lambda_r * F(x))``
``exclusive_gating``        2c      ``relu((1 - g(x)) * x + g(x) * F(x))``
``shortcut_only_gating``    2d      ``relu((1 - g(x)) * x + F(x))``
``conv_shortcut``           2e      ``relu(conv1x1(x) + F(x))`` in every unit
``dropout_shortcut``        2f      ``relu(dropout(x) + F(x))``
==========================  ======  ===============================================

The Table 1 units (Fig. 2) are the original unit with a changed shortcut; their ``F``
is the original one. ``g(x) = sigmoid(conv1x1(x) + b_g)`` is a 1x1 conv gate whose
bias starts at ``b_g`` (`gate_bias`). Where a unit changes the shape its shortcut
``x`` is a 1x1 projection (as in the default unit).

This module is plain Python (no Keras), so configs can be checked before any layer
is built.
"""

import math
import numbers

#: Every unit name, the default first. KerasTuner can search over this list.
UNIT_TYPES = (
    "full_preact",
    "original",
    "bn_after_addition",
    "relu_before_addition",
    "relu_only_preact",
    "constant_scaling",
    "exclusive_gating",
    "shortcut_only_gating",
    "conv_shortcut",
    "dropout_shortcut",
)
DEFAULT_UNIT = "full_preact"

#: Units whose activation comes before the convs (Fig. 4d, 4e): the network has no
#: activation after its stem conv and one extra activation after its last unit.
PREACTIVATION_UNITS = ("full_preact", "relu_only_preact")
#: Units ending in a ReLU after the addition (the 2015 design and its Table 1
#: variants): the stem is conv-BN-ReLU and nothing follows the last unit.
POST_RELU_UNITS = (
    "original",
    "bn_after_addition",
    "constant_scaling",
    "exclusive_gating",
    "shortcut_only_gating",
    "conv_shortcut",
    "dropout_shortcut",
)
GATING_UNITS = ("exclusive_gating", "shortcut_only_gating")

#: Parameter name -> (units that take it, the paper's value used when None).
UNIT_PARAMETERS = {
    "shortcut_scale": (("constant_scaling",), 0.5),
    "residual_scale": (("constant_scaling",), 0.5),
    "gate_bias": (GATING_UNITS, -6.0),
    "dropout_rate": (("dropout_shortcut",), 0.5),
}

#: CIFAR-10 test error (%) in the paper: Table 2 for ResNet-110 and ResNet-164 (the
#: placements), Table 1 for ResNet-110 (the shortcuts; "fail" = error above 20%).
#: Keys: (unit, a short description of its parameters).
PAPER_RESULTS = {
    "full_preact": {"resnet110": "6.37", "resnet164": "5.46"},
    "original": {"resnet110": "6.61", "resnet164": "5.93"},
    "bn_after_addition": {"resnet110": "8.17", "resnet164": "6.50"},
    "relu_before_addition": {"resnet110": "7.84", "resnet164": "6.14"},
    "relu_only_preact": {"resnet110": "6.71", "resnet164": "5.91"},
    "constant_scaling": {"resnet110": "12.35 (0.5/0.5); fail (0/1, 0.5/1)"},
    "exclusive_gating": {"resnet110": "8.70 (b_g=-6); 9.81 (b_g=-7); fail (b_g=0..-5, -10)"},
    "shortcut_only_gating": {"resnet110": "6.91 (b_g=-6); 12.86 (b_g=0)"},
    "conv_shortcut": {"resnet110": "12.22"},
    "dropout_shortcut": {"resnet110": "fail (rate 0.5)"},
}


def _real(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite real number. Received: {name}={value!r}")
    return float(value)


def check_unit_name(unit):
    """Raises ValueError listing the valid names unless `unit` is one of `UNIT_TYPES`."""
    if not isinstance(unit, str) or unit not in UNIT_TYPES:
        raise ValueError(f"Unknown `unit`. Received: unit={unit!r}. Valid: {list(UNIT_TYPES)}")
    return unit


def resolve_unit_options(unit, *, shortcut_scale=None, residual_scale=None, gate_bias=None,
                         dropout_rate=None):
    """Checks a unit name and its parameters; returns the values the unit computes with.

    Args:
        unit: one of `UNIT_TYPES`.
        shortcut_scale: lambda on the shortcut of ``constant_scaling`` (>= 0; paper:
            0, 0.5; default 0.5).
        residual_scale: lambda on the residual of ``constant_scaling`` (>= 0; paper:
            1, 0.5; default 0.5).
        gate_bias: initial bias b_g of the gate of ``exclusive_gating`` and
            ``shortcut_only_gating`` (finite; paper: 0, -6, -7, -10; default -6).
        dropout_rate: drop probability on the shortcut of ``dropout_shortcut``
            (in [0, 1); paper: 0.5; default 0.5).

    Returns:
        dict with exactly the parameters `unit` takes, filled in.

    Raises:
        ValueError: for an unknown name, a parameter the unit does not take, or an
            invalid value.

    Example:
        >>> resolve_unit_options("exclusive_gating")
        {'gate_bias': -6.0}
    """
    check_unit_name(unit)
    given = dict(shortcut_scale=shortcut_scale, residual_scale=residual_scale,
                 gate_bias=gate_bias, dropout_rate=dropout_rate)
    resolved = {}
    for name, value in given.items():
        units, default = UNIT_PARAMETERS[name]
        if unit not in units:
            if value is not None:
                raise ValueError(
                    f"`{name}` applies only to unit in {list(units)}. "
                    f"Received: {name}={value!r} with unit={unit!r}"
                )
            continue
        value = default if value is None else _real(name, value)
        if name in ("shortcut_scale", "residual_scale") and value < 0:
            raise ValueError(
                f"`{name}` (the constant lambda) must be >= 0 (the paper tries 0, 0.5 and 1). "
                f"Received: {name}={value!r}"
            )
        if name == "dropout_rate" and not 0.0 <= value < 1.0:
            raise ValueError(
                f"`dropout_rate` must be in [0, 1) (the paper uses 0.5). "
                f"Received: dropout_rate={value!r}"
            )
        resolved[name] = value
    return resolved
