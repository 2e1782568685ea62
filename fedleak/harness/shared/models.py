"""The model zoo: architectures the federated user trains, built from a name and the data shape.

Every builder takes the data set's ``(C, H, W)`` shape and class count, plus string-typed options
(``width=64``) as they arrive from the CLI or the wire, and returns an ``nn.Module`` whose
activations are not in-place (Opacus needs that, and so does double back-propagation).

Names:

- ``lenet-zhu``: the sigmoid LeNet of Deep Leakage from Gradients (Zhu et al. 2019), weights and
  biases drawn from U(-0.5, 0.5) as in that paper's code.
- ``convnet``: the 8-layer ConvNet of Inverting Gradients (supplement Fig. 2), width ``D``
  (option ``width``, default 64): conv-BN-ReLU blocks with D, 2D, 2D, 4D, 4D, 4D channels, a
  3×3 max-pool, two more 4D blocks, another 3×3 max-pool, and a linear classifier (pools round
  up for inputs under 27 px, so it also takes 8×8 digits and 25×25 faces).
- ``resnet20-4``: the CIFAR ResNet-20 (He et al. 2016, three stages of three basic blocks) with
  every width multiplied by 4 (option ``width`` changes the multiplier).
- ``resnet18`` … ``resnet152``: torchvision's ImageNet ResNets, first convolution adapted to the
  channel count.
- ``mlp``: fully-connected ReLU network, ``depth`` hidden layers of ``width`` units (options
  ``width``, default 256, ``depth``, default 2, ``bias``, default true). With ``bias=false`` it
  is the homogeneous MLP of the KKT attack.
- ``imprint``: a server-designed imprint block (Fowl et al. 2022,
  :mod:`fedleak.attacks.imprint_block`) of ``bins`` units (default 128) in front of the model
  ``inner`` (default ``mlp``); options of the inner model as ``inner.KEY=VALUE``, e.g.
  ``imprint:bins=256,inner=convnet,inner.width=16``. A victim that runs it emulates a user who
  accepted an architecture the server distributed (the malicious-architecture threat model).
- ``kkt-mlp``: Haim et al.'s (2022) binary classifier d–1000–1000–1 (:class:`KKTMLP`; options
  ``width``, default 1000, ``depth``, default 2, ``init-std`` of the first layer, default 1e-4),
  one output logit whatever the class count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak.harness.shared.torchvision_compat import import_torchvision


class ModelError(ValueError):
    """A model name, option or input shape that cannot be built; the message says what to change."""


@dataclass(frozen=True)
class ModelSpec:
    """A model by name with its string-typed options, as the CLI and the proto carry it."""

    name: str
    options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse ``name`` or ``name:key=value,key=value``."""
        name, _, rest = text.partition(":")
        options: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ModelError(f"model option {item!r} must look like key=value")
            options[key.strip()] = value.strip()
        return cls(name.strip(), options)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))


Shape = tuple[int, int, int]
OPACUS_OPTION = "opacus"
Builder = Callable[[Shape, int, dict[str, str]], nn.Module]
_BUILDERS: dict[str, Builder] = {}
_OPTIONS: dict[str, tuple[str, ...]] = {}


def _register(name: str, options: tuple[str, ...] = ()) -> Callable[[Builder], Builder]:
    def wrap(builder: Builder) -> Builder:
        _BUILDERS[name] = builder
        _OPTIONS[name] = options
        return builder

    return wrap


def model_names() -> tuple[str, ...]:
    """The names :func:`build_model` accepts."""
    return tuple(_BUILDERS)


def model_options(name: str) -> tuple[str, ...]:
    """The ``key=value`` options model ``name`` takes (``name:key=value,...``)."""
    if name not in _OPTIONS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(_BUILDERS)}")
    return _OPTIONS[name]


def build_model(spec: ModelSpec | str, shape: Shape, num_classes: int) -> nn.Module:
    """Build the model ``spec`` for inputs of ``shape`` = (C, H, W) and ``num_classes`` classes.

    Raises :class:`ModelError` naming the valid models or options when ``spec`` is unknown.
    """
    if isinstance(spec, str):
        spec = ModelSpec.parse(spec)
    if spec.name not in _BUILDERS:
        raise ModelError(f"unknown model {spec.name!r}; choose one of {', '.join(_BUILDERS)}")
    options = dict(spec.options)
    opacus = options.pop(OPACUS_OPTION, "false").lower() in ("true", "1")
    unknown = {k for k in set(options) - set(_OPTIONS[spec.name])
               if not (INNER_PREFIX in _OPTIONS[spec.name] and k.startswith(INNER_PREFIX))}
    if unknown:
        valid = ", ".join((*_OPTIONS[spec.name], OPACUS_OPTION))
        raise ModelError(f"model {spec.name!r} has no option {sorted(unknown)}; valid: {valid}")
    chw = (int(shape[0]), int(shape[1]), int(shape[2]))
    model = _BUILDERS[spec.name](chw, int(num_classes), options)
    if opacus:
        model = opacus_compatible(model)
    _check_forward(model, spec, chw)
    return model


def opacus_compatible(model: nn.Module) -> nn.Module:
    """Opacus's ``ModuleValidator.fix``: BatchNorm → GroupNorm, so per-example gradients exist.

    Any model accepts the option ``opacus=true`` to be built this way; a victim running DP-SGD
    publishes its model spec with it, so the attacker builds the same architecture.
    """
    from opacus.validators import ModuleValidator

    fixed = ModuleValidator.fix(model)
    errors = ModuleValidator.validate(fixed, strict=False)
    if errors:
        raise ModelError(f"model cannot be made Opacus-compatible: {errors}")
    return fixed


def _check_forward(model: nn.Module, spec: ModelSpec, shape: Shape) -> None:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, *shape))
    except (RuntimeError, ValueError) as err:
        raise ModelError(f"model {spec} cannot take inputs of shape {shape}: {err}") from err
    finally:
        model.train(was_training)


def _int(options: dict[str, str], key: str, default: int) -> int:
    try:
        return int(options.get(key, default))
    except ValueError as err:
        raise ModelError(f"model option {key} must be an integer, got {options[key]!r}") from err


def _flat_features(body: nn.Module, shape: Shape) -> int:
    body.eval()
    try:
        with torch.no_grad():
            return int(body(torch.zeros(1, *shape)).flatten(1).shape[1])
    except (RuntimeError, ValueError) as err:
        raise ModelError(f"input shape {shape} is too small for this model: {err}") from err
    finally:
        body.train()


class LeNetZhu(nn.Module):
    """DLG's LeNet: three 5×5 sigmoid convolutions (strides 2, 2, 1) and one linear layer."""

    def __init__(self, shape: Shape, num_classes: int) -> None:
        super().__init__()
        channels = shape[0]
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            nn.Sigmoid(),
            nn.Flatten(),
        )
        self.fc = nn.Linear(_flat_features(self.body, shape), num_classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.uniform_(module.weight, -0.5, 0.5)
                if module.bias is not None:
                    nn.init.uniform_(module.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


@_register("lenet-zhu")
def _lenet_zhu(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    return LeNetZhu(shape, num_classes)


def _conv_bn_relu(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]


class ConvNet(nn.Module):
    """Inverting Gradients' ConvNet (supplement Fig. 2): 8 conv-BN-ReLU layers, 2 max-pools."""

    def __init__(self, shape: Shape, num_classes: int, width: int = 64) -> None:
        super().__init__()
        d = width
        widths = [shape[0], d, 2 * d, 2 * d, 4 * d, 4 * d, 4 * d]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(widths[:-1], widths[1:], strict=True):
            layers += _conv_bn_relu(c_in, c_out)
        # Below 27 px two floor-rounded 3×3 pools would leave nothing (8×8 digits: 8→2→0), so
        # small inputs round up (8→3→1); at 32×32 the network is exactly the paper's.
        ceil = min(shape[1:]) < 27
        layers.append(nn.MaxPool2d(3, ceil_mode=ceil))
        layers += _conv_bn_relu(4 * d, 4 * d) + _conv_bn_relu(4 * d, 4 * d)
        layers += [nn.MaxPool2d(3, ceil_mode=ceil), nn.Flatten()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(_flat_features(self.body, shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


@_register("convnet", options=("width",))
def _convnet(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    return ConvNet(shape, num_classes, width=_int(options, "width", 64))


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with an identity (or 1×1 projection) shortcut, then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR ResNet-(6n+2) of He et al. (2016) with widths 16k, 32k, 64k."""

    def __init__(self, shape: Shape, num_classes: int, blocks: int, multiplier: int) -> None:
        super().__init__()
        widths = [16 * multiplier, 32 * multiplier, 64 * multiplier]
        self.conv = nn.Conv2d(shape[0], widths[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        stages: list[nn.Module] = []
        c_in = widths[0]
        for stage, c_out in enumerate(widths):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                stages.append(BasicBlock(c_in, c_out, stride))
                c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[-1], num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn(self.conv(x)))
        out = self.pool(self.stages(out))
        return self.fc(out.flatten(1))


@_register("resnet20-4", options=("width",))
def _resnet20_4(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    return CifarResNet(shape, num_classes, blocks=3, multiplier=_int(options, "width", 4))


def _torchvision_resnet(depth: int) -> Builder:
    def build(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
        torchvision = import_torchvision()
        model = getattr(torchvision.models, f"resnet{depth}")(num_classes=num_classes)
        if shape[0] != 3:
            model.conv1 = nn.Conv2d(shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
        for module in model.modules():
            if isinstance(module, nn.ReLU):
                module.inplace = False
        return model

    return build


for _depth in (18, 34, 50, 101, 152):
    _register(f"resnet{_depth}")(_torchvision_resnet(_depth))


class MLP(nn.Module):
    """Flatten, then ``depth`` ReLU layers of ``width`` units, then a linear classifier."""

    def __init__(
        self, shape: Shape, num_classes: int, width: int = 256, depth: int = 2, bias: bool = True
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        fan_in = shape[0] * shape[1] * shape[2]
        for _ in range(depth):
            layers += [nn.Linear(fan_in, width, bias=bias), nn.ReLU()]
            fan_in = width
        layers.append(nn.Linear(fan_in, num_classes, bias=bias))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@_register("mlp", options=("width", "depth", "bias"))
def _mlp(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    bias = options.get("bias", "true").lower()
    if bias not in ("true", "false", "1", "0"):
        raise ModelError(f"model option bias must be true or false, got {bias!r}")
    return MLP(
        shape,
        num_classes,
        width=_int(options, "width", 256),
        depth=_int(options, "depth", 2),
        bias=bias in ("true", "1"),
    )


INNER_PREFIX = "inner."


@_register("imprint", options=("bins", "inner", INNER_PREFIX))
def _imprint(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    """An imprint block of ``bins`` units in front of ``inner`` (its options as ``inner.KEY``)."""
    from fedleak.attacks.imprint_block import ImprintedModel

    inner_name = options.get("inner", "mlp")
    if inner_name == "imprint":
        raise ModelError("an imprint model cannot wrap another imprint model")
    inner_options = {k[len(INNER_PREFIX):]: v for k, v in options.items()
                     if k.startswith(INNER_PREFIX)}
    inner = build_model(ModelSpec(inner_name, inner_options), shape, num_classes)
    bins = _int(options, "bins", 128)
    if bins < 2:
        raise ModelError(f"model option bins must be at least 2, got {bins}")
    return ImprintedModel(shape, bins, inner)


def load_checkpoint(model: nn.Module, path: str) -> None:
    """Load a plain state dict from ``path`` (``weights_only``: no code runs from the file)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError, ...
        raise ModelError(f"checkpoint {path} is not a PyTorch state dict that loads without "
                         f"running code ({type(err).__name__}: {str(err)[:200]}); save it with "
                         "torch.save(model.state_dict(), path)") from None
    if not isinstance(state, dict):
        raise ModelError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict; "
                         "save it with torch.save(model.state_dict(), path)")
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        raise ModelError(f"checkpoint {path} does not fit the model: {err}") from err


class KKTMLP(nn.Module):
    """The binary classifier of Haim et al. (2022, Sec. 5.1): d–width–…–width–1 ReLU MLP.

    ``depth`` hidden layers of ``width`` units (paper: 2 of 1000). Only the first layer has a
    bias; the others have none, so Φ(c·θ; x) = c^{depth+1} Φ(θ; x): the network is homogeneous
    in *all* its parameters, first-layer bias included (Theorem 3.1's assumption). Init: the
    first layer's weight and bias ~ N(0, init_std²) (paper: 1e-4, Sec. 5.2 explains why small
    helps); every other weight keeps PyTorch's Kaiming-uniform default for ``nn.Linear``
    (``kaiming_uniform_(a=√5)``, i.e. U(±1/√fan_in)), the "standard Kaiming He
    initialization" the paper names and its authors' code uses. The output is
    the single logit Φ(θ; x), shape ``[n, 1]``; its sign is the label y ∈ {±1}. Inputs are
    flattened, so any ``(C, H, W)`` or ``(d,)`` shape works; the KKT attack expects them scaled
    to [-1, 1] (see :mod:`fedleak.harness.federated.release_training`).
    """

    def __init__(
        self, in_features: int, width: int = 1000, depth: int = 2, init_std: float = 1e-4
    ) -> None:
        super().__init__()
        if width < 1 or depth < 1 or not init_std > 0:
            raise ModelError(
                f"kkt-mlp needs width >= 1, depth >= 1, init-std > 0; got {width}, {depth}, "
                f"{init_std}"
            )
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(in_features, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width, bias=False), nn.ReLU()]
        layers.append(nn.Linear(width, 1, bias=False))
        self.layers = nn.Sequential(*layers)
        linears = [m for m in self.layers if isinstance(m, nn.Linear)]
        nn.init.normal_(linears[0].weight, std=init_std)
        nn.init.normal_(linears[0].bias, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@_register("kkt-mlp", options=("width", "depth", "init-std"))
def _kkt_mlp(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    """Haim et al.'s binary MLP; ``num_classes`` is ignored (one logit, labels ±1)."""
    try:
        init_std = float(options.get("init-std", 1e-4))
    except ValueError as err:
        text = options["init-std"]
        raise ModelError(f"model option init-std must be a number, got {text!r}") from err
    in_features = 1
    for size in shape:
        in_features *= int(size)
    return KKTMLP(
        in_features, width=_int(options, "width", 1000), depth=_int(options, "depth", 2),
        init_std=init_std,
    )
