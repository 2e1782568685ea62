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
  :mod:`fedleak.attacks.malicious.imprint_block`) of ``bins`` units (default 128) in front of the
  model ``inner`` (default ``mlp``); options of the inner model as ``inner.KEY=VALUE``, e.g.
  ``imprint:bins=256,inner=convnet,inner.width=16``. A victim that runs it emulates a user who
  accepted an architecture the server distributed (the malicious-architecture threat model).
- ``kkt-mlp``: Haim et al.'s (2022) binary classifier d–1000–1000–1 (:class:`KKTMLP`; options
  ``width``, default 1000, ``depth``, default 2, ``init-std`` of the first layer, default 1e-4),
  one output logit whatever the class count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedleak.harness.zoo.architectures import KKTMLP, MLP, CifarResNet, ConvNet, LeNetZhu
from fedleak.harness.zoo.model_spec import ModelError, ModelSpec, Shape
from fedleak.harness.zoo.torchvision_compat import import_torchvision
from fedleak.harness.zoo.user_models import FACTORY, build_factory, run_user_code

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


def build_model(spec: ModelSpec | str, shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build the model ``spec`` for inputs of ``shape`` = (C, H, W) and ``num_classes`` classes.

    Raises :class:`ModelError` naming the valid models or options when ``spec`` is unknown,
    and when ``shape`` is not an image's (text models: :mod:`fedleak.harness.zoo.text.text_models`).
    """
    if isinstance(spec, str):
        spec = ModelSpec.parse(spec)
    if spec.name == FACTORY:  # the user's own module:factory (user_models)
        if len(shape) != 3:
            raise ModelError(f"a module:factory model takes images (C, H, W), but the data's "
                             f"shape is {tuple(shape)} (text: token sequences); choose a text "
                             "model (gpt2, bert, hf) for text data")
        path = spec.options.get("path", "")
        model = build_factory(path)
        chw = (int(shape[0]), int(shape[1]), int(shape[2]))
        logits = run_user_code(f"the forward of the model {path}() on one input of "
                               f"{list(chw)}", lambda: _check_forward(model, spec, chw))
        if not isinstance(logits, torch.Tensor):
            raise ModelError(f"model {path} returns a {type(logits).__name__} for one input of "
                             f"{list(chw)}: it must return the logits tensor "
                             f"[1, {num_classes}]")
        if tuple(logits.shape) != (1, int(num_classes)):
            raise ModelError(f"model {spec.options.get('path')} gives outputs of shape "
                             f"{list(logits.shape)} for one input of {list(chw)}; the data has "
                             f"{num_classes} classes: it must give [1, {num_classes}]")
        return model
    if len(shape) != 3:
        raise ModelError(f"model {spec.name!r} takes images (C, H, W), but the data's shape is "
                         f"{tuple(shape)} (text: token sequences); choose a text model "
                         "(gpt2, bert, hf) for text data")
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


def _check_forward(model: nn.Module, spec: ModelSpec, shape: Shape) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out: torch.Tensor = model(torch.zeros(1, *shape))
            return out
    except (RuntimeError, ValueError) as err:
        raise ModelError(f"model {spec} cannot take inputs of shape {shape}: {err}") from err
    finally:
        model.train(was_training)


def _int(options: dict[str, str], key: str, default: int) -> int:
    try:
        return int(options.get(key, default))
    except ValueError as err:
        raise ModelError(f"model option {key} must be an integer, got {options[key]!r}") from err


@_register("lenet-zhu")
def _lenet_zhu(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    return LeNetZhu(shape, num_classes)


@_register("convnet", options=("width",))
def _convnet(shape: Shape, num_classes: int, options: dict[str, str]) -> nn.Module:
    return ConvNet(shape, num_classes, width=_int(options, "width", 64))


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
    from fedleak.attacks.malicious.imprint_block import ImprintedModel

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
