"""The model zoo's own architectures, as ``nn.Module`` classes (no in-place activations).

:mod:`fedleak.harness.zoo.models` builds them by name (``lenet-zhu``, ``convnet``,
``resnet20-4``, ``mlp``, ``kkt-mlp``), and says what each is.
"""

from __future__ import annotations

import torch
from torch import nn

from fedleak.harness.zoo.model_spec import ModelError, Shape


def flat_features(body: nn.Module, shape: Shape) -> int:
    """The feature count ``body`` outputs for one input of ``shape``, flattened."""
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
        self.fc = nn.Linear(flat_features(self.body, shape), num_classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.uniform_(module.weight, -0.5, 0.5)
                if module.bias is not None:
                    nn.init.uniform_(module.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def conv_bn_relu(c_in: int, c_out: int) -> list[nn.Module]:
    """A 3×3 convolution (padding 1), batch norm and ReLU."""
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]


class ConvNet(nn.Module):
    """Inverting Gradients' ConvNet (supplement Fig. 2): 8 conv-BN-ReLU layers, 2 max-pools."""

    def __init__(self, shape: Shape, num_classes: int, width: int = 64) -> None:
        super().__init__()
        d = width
        widths = [shape[0], d, 2 * d, 2 * d, 4 * d, 4 * d, 4 * d]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(widths[:-1], widths[1:], strict=True):
            layers += conv_bn_relu(c_in, c_out)
        # Below 27 px two floor-rounded 3×3 pools would leave nothing (8×8 digits: 8→2→0), so
        # small inputs round up (8→3→1); at 32×32 the network is exactly the paper's.
        ceil = min(shape[1:]) < 27
        layers.append(nn.MaxPool2d(3, ceil_mode=ceil))
        layers += conv_bn_relu(4 * d, 4 * d) + conv_bn_relu(4 * d, 4 * d)
        layers += [nn.MaxPool2d(3, ceil_mode=ceil), nn.Flatten()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(flat_features(self.body, shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


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
