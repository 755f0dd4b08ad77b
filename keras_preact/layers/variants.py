"""The residual units compared in He et al. 2016 (arXiv:1603.05027), as data. Every unit is
``y = f(h(x) + F(x))``, differing in where BN and ReLU go (Section 4, Fig. 4, Table 2) or
in the shortcut ``h`` (Section 3, Fig. 2, Table 1). The gating units' gate is ``g(x) =
sigmoid(conv1x1(x) + b_g)``. Plain Python (no Keras), so configs can be checked before
any layer is built."""

import dataclasses
import math
import numbers

from keras_preact.checks import check_choice


@dataclasses.dataclass(frozen=True)
class Unit:
    """One residual unit of the paper.

    Attributes:
        preactivation: ReLU before each conv of F (Fig. 4d, 4e), not after every conv
            but the last; the stem then has no BN-ReLU and a ReLU follows the last unit.
        bn_before_conv: F is (BN-ReLU-conv) x n (Fig. 4e), else its BNs follow the
            convs. The network then ends in BN-ReLU; conv biases are allowed.
        bn_after_addition: ``f`` = ReLU(BN(.)) and F's last BN is removed (Fig. 4b).
        relu_after_addition: ``f`` ends in a ReLU (the 2015 design, Table 1).
        relu_before_addition: F ends in a ReLU (Fig. 4c).
        shortcut: ``h``: "identity", "scaling" (``lambda_s x + lambda_r F``),
            "exclusive_gate" (``(1 - g) x + g F``), "shortcut_gate" (``(1 - g) x + F``),
            "conv" (a 1x1 conv in every unit) or "dropout".
        parameters: the unit's keyword parameters with the paper's values.
        paper: CIFAR-10 test error (%) in the paper (Tables 1, 2; "fail" = above 20%)."""

    figure: str
    preactivation: bool = False
    bn_before_conv: bool = False
    bn_after_addition: bool = False
    relu_after_addition: bool = True
    relu_before_addition: bool = False
    shortcut: str = "identity"
    parameters: tuple = ()
    paper: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def gated(self):
        return self.shortcut in ("exclusive_gate", "shortcut_gate")

    @property
    def projection_bn(self):
        # Units without a BN pre-activation normalise a projection (conv-BN, 2015).
        return not self.preactivation


_LAMBDAS = (("shortcut_scale", 0.5), ("residual_scale", 0.5))
_GATE = (("gate_bias", -6.0),)
_PREACT = dict(preactivation=True, relu_after_addition=False)

#: name -> `Unit`, the default first.
UNITS = {
    "full_preact": Unit("4e", bn_before_conv=True, **_PREACT,
                        paper={"resnet110": "6.37", "resnet164": "5.46"}),
    "original": Unit("4a", paper={"resnet110": "6.61", "resnet164": "5.93"}),
    "bn_after_addition": Unit("4b", bn_after_addition=True,
                              paper={"resnet110": "8.17", "resnet164": "6.50"}),
    "relu_before_addition": Unit("4c", relu_after_addition=False, relu_before_addition=True,
                                 paper={"resnet110": "7.84", "resnet164": "6.14"}),
    "relu_only_preact": Unit("4d", **_PREACT, paper={"resnet110": "6.71", "resnet164": "5.91"}),
    "constant_scaling": Unit("2b", shortcut="scaling", parameters=_LAMBDAS, paper={
        "resnet110": "12.35 (0.5/0.5); fail (0/1, 0.5/1)"}),
    "exclusive_gating": Unit("2c", shortcut="exclusive_gate", parameters=_GATE, paper={
        "resnet110": "8.70 (b_g=-6); 9.81 (b_g=-7); fail (b_g=0..-5, -10)"}),
    "shortcut_only_gating": Unit("2d", shortcut="shortcut_gate", parameters=_GATE, paper={
        "resnet110": "6.91 (b_g=-6); 12.86 (b_g=0)"}),
    "conv_shortcut": Unit("2e", shortcut="conv", paper={"resnet110": "12.22"}),
    "dropout_shortcut": Unit("2f", shortcut="dropout", parameters=(("dropout_rate", 0.5),),
                             paper={"resnet110": "fail (rate 0.5)"})}
#: Every unit name, the default first. KerasTuner can search over this list.
UNIT_TYPES = tuple(UNITS)
DEFAULT_UNIT = UNIT_TYPES[0]
PAPER_RESULTS = {name: unit.paper for name, unit in UNITS.items()}
_PARAMETERS = ("shortcut_scale", "residual_scale", "gate_bias", "dropout_rate")


def get_unit(unit):
    """The `Unit` record of `unit`; ValueError listing the valid names."""
    return UNITS[check_choice("unit", unit, UNIT_TYPES)]


def check_unit_name(unit):
    """Returns `unit`; ValueError listing the valid names."""
    return check_choice("unit", unit, UNIT_TYPES)


def resolve_unit_options(unit, *, shortcut_scale=None, residual_scale=None, gate_bias=None,
                         dropout_rate=None):
    """Checks a unit name and its parameters; returns a dict of exactly the parameters
    `unit` takes, None filled with the paper's value (ValueError otherwise).

    Args:
        shortcut_scale, residual_scale: the lambdas of ``constant_scaling`` (>= 0;
            paper: 0/1, 0.5/1, 0.5/0.5; default 0.5 each).
        gate_bias: initial gate bias b_g of the gating units (default -6).
        dropout_rate: shortcut drop rate of ``dropout_shortcut`` (in [0, 1); 0.5).

    Example:
        >>> resolve_unit_options("exclusive_gating")
        {'gate_bias': -6.0}
    """
    defaults = dict(get_unit(unit).parameters)
    resolved = {}
    for name, value in zip(_PARAMETERS, (shortcut_scale, residual_scale, gate_bias, dropout_rate)):
        if name not in defaults:
            if value is not None:
                takers = [n for n, u in UNITS.items() if name in dict(u.parameters)]
                raise ValueError(f"`{name}` applies only to unit in {takers}. "
                                 f"Received: {name}={value!r} with unit={unit!r}")
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                  or not math.isfinite(value)):
            raise ValueError(f"`{name}` must be a finite real number. Received: {name}={value!r}")
        value = float(defaults[name] if value is None else value)
        if name.endswith("_scale") and value < 0:
            raise ValueError(f"`{name}` (the constant lambda) must be >= 0 (the paper tries 0, "
                             f"0.5 and 1). Received: {name}={value!r}")
        if name == "dropout_rate" and not 0.0 <= value < 1.0:
            raise ValueError("`dropout_rate` must be in [0, 1) (the paper uses 0.5). "
                             f"Received: dropout_rate={value!r}")
        resolved[name] = value
    return resolved
