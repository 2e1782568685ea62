"""The shortest useful attack plug-in: match the observed update by cosine distance with Adam.

docs/how-to/write-an-attack.md walks through it. The folder is laid out as pip installs a
package (this module and a ``*.dist-info`` holding the ``fedleak.attacks`` entry point), so
putting it on ``PYTHONPATH`` installs it::

    PYTHONPATH=examples/attack_plugin fedleak attack --victim 127.0.0.1:50051 \\
        --attack cosine-sketch -o iterations=300
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.attacks import Attack, Observation, Progress, Reconstruction
from fedleak.attacks.labels import recover_labels


@dataclass
class CosineSketchConfig:
    iterations: int = field(default=300, metadata={"help": "Adam steps"})
    lr: float = field(default=0.1, metadata={"help": "Adam step size"})


class CosineSketch(Attack[Observation]):
    """x̂ = argmin_x 1 − cos(simulate(x, ŷ), update), labels ŷ recovered from the update."""

    Config = CosineSketchConfig

    def recover(self, target: Observation, *, device: torch.device, seed: int,
                progress: Progress | None) -> Reconstruction:
        labels = recover_labels(target)  # iDLG for one image, a counting estimate for a batch
        shape = (target.num_images, *target.image_shape)
        x = torch.randn(shape, device=device, requires_grad=True)  # seeded by reconstruct()
        optimiser = torch.optim.Adam([x], lr=self.config.lr)
        observed = torch.cat([u.flatten() for u in target.update])
        loss = torch.zeros(())
        for step in range(self.config.iterations):
            optimiser.zero_grad()
            replayed = torch.cat([u.flatten() for u in target.simulate(x, labels)])
            loss = 1 - torch.nn.functional.cosine_similarity(replayed, observed, dim=0)
            loss.backward()
            optimiser.step()
            if progress is not None and step % 50 == 0:
                progress(step, self.config.iterations, float(loss.detach()))
        return Reconstruction(images=x.detach(), labels=labels, objective=float(loss.detach()),
                              iterations=self.config.iterations)
