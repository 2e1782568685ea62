"""The order a shuffling FedAvg user visited its images in, as a variable of the attack.

A FedAvg user that shuffles (``DataLoader(shuffle=True)``) visits its n images in a new secret
order every epoch: E epochs of K mini-batches of B, L = E·K local SGD steps. Dimitrov et al.
("Data Leakage in Federated Averaging", TMLR 2022, Sec. 4) replay each epoch on its own copy of
the candidate images (:mod:`fedleak.attacks.epochs`), which absorbs the order *within* the
slots — but the label of each slot is fixed, so which labels shared a mini-batch stays a guess
(their code: a random one). This module makes that guess a variable of the attack. Slot i of
every copy carries the recovered label ŷ_i, and epoch e visits the rows of its copy in an
order π_e the attack chooses: batch k of epoch e is rows π_e[kB : (k+1)B]. For every order the
user drew there are images x and orders π whose replay *is* the user's update (its images at
the slots, π_e its permutation), so the replay family contains the truth: the order is
unknown, and modelled.

**Estimating π from the output layer.** With every step's gradient taken at θ_k (first
order), the last layer's bias moves by

    Δb ≈ −τ Σ_s w_s (p̄_s − h_s),      h_s = (1/|B_s|) Σ_{i ∈ B_s} e_{ŷ_i},

with p̄_s the mean softmax of step s's batch and w_s the step's weight (momentum weighs early
steps more: w_s = Σ_{m ≥ s} μ^{m−s}, :meth:`~fedleak.attacks.replay_contract.OrderedReplay.
step_weights`). Replaying the current candidates (x, π) gives Δb(x, π); where their softmax is
close to the user's (an untrained model predicts nearly the same for every image), the
residual

    r = (Δb* − Δb(x, π)) / τ  ≈  Σ_s w_s (h*_s − h_s)

says how the label make-up of the batches must change. Exchanging slot i (label a, batch s)
with slot j (label b, batch t) of one epoch changes Σ_s w_s h_s by

    v = (e_b − e_a) (w_s/|B_s| − w_t/|B_t|),

so :func:`exchange` applies, greedily, the exchange with the largest ‖r‖² − ‖r − v‖² > 0 until
none is left. With equal weights and batch sizes (plain SGD) v = 0: the bias cannot tell the
batches apart, the order stays where it started — :func:`stratified_order`, every label dealt
evenly over the batches, the expected make-up of a random shuffle. A revision is kept only if
it lowers the attack's objective at the current images (:class:`OrderModel`), so an estimate
misled by a trained model's softmax cannot make the order worse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from fedleak.attacks.labels import last_layer_indices
from fedleak.attacks.observation import Observation
from fedleak.attacks.replay_contract import OrderedReplay

#: how much an exchange must shrink ‖r‖², relative to it, to be made
MIN_GAIN = 1e-9


def stratified_order(labels: torch.Tensor, batches: Sequence[slice], epochs: int, copies: int
                     ) -> torch.Tensor:
    """The initial order [E, n]: in every epoch the slots, sorted by label, dealt round robin
    over the batches that still have room (each label spread evenly); epoch e visits the rows
    of copy e (``copies`` = E) or of the one copy (``copies`` = 1)."""
    n = int(labels.numel())
    by_label = sorted(range(n), key=lambda i: (int(labels[i]), i))
    room = [b.stop - b.start for b in batches]
    dealt: list[list[int]] = [[] for _ in batches]
    k = 0
    for slot in by_label:
        while len(dealt[k]) >= room[k]:
            k = (k + 1) % len(batches)
        dealt[k].append(slot)
        k = (k + 1) % len(batches)
    one = torch.tensor([slot for batch in dealt for slot in batch], dtype=torch.long)
    return torch.stack([one + (e * n if copies > 1 else 0) for e in range(epochs)])


def exchange(order: torch.Tensor, labels: torch.Tensor, residual: torch.Tensor,
             weights: Sequence[float], batches: Sequence[slice], num_classes: int
             ) -> tuple[torch.Tensor, int]:
    """The order after greedy exchanges that shrink ‖r − Σ v‖² (module docstring), and how many
    were made. ``order`` [E, n] indexes rows whose label is ``labels[row % n]``; ``weights``
    has one entry per local step (E·K)."""
    order = order.clone()
    n = order.shape[1]
    r = residual.detach().double().cpu().clone()
    sizes = [b.stop - b.start for b in batches]
    per_step = torch.tensor([w / sizes[s % len(batches)] for s, w in enumerate(weights)],
                            dtype=torch.float64)
    slot_label = labels.detach().cpu()
    moves = 0
    for _ in range(order.numel()):
        best = (MIN_GAIN * float(r.square().sum()), None)
        for e in range(order.shape[0]):
            counts = torch.stack([torch.bincount(slot_label[order[e, b] % n],
                                                 minlength=num_classes) for b in batches])
            for k1 in range(len(batches)):
                for k2 in range(k1 + 1, len(batches)):
                    alpha = float(per_step[e * len(batches) + k1]
                                  - per_step[e * len(batches) + k2])
                    if alpha == 0:
                        continue
                    # gain[a, b] of exchanging a label-a slot of k1 with a label-b slot of k2
                    gain = 2 * alpha * (r.view(1, -1) - r.view(-1, 1)) - 2 * alpha ** 2
                    allowed = (counts[k1].view(-1, 1) > 0) & (counts[k2].view(1, -1) > 0)
                    gain = torch.where(allowed, gain, torch.full_like(gain, -torch.inf))
                    gain.fill_diagonal_(-torch.inf)
                    value, flat = gain.view(-1).max(0)
                    if float(value) > best[0]:
                        a, b = divmod(int(flat), num_classes)
                        best = (float(value), (e, k1, k2, a, b, alpha))
        if best[1] is None:
            break
        e, k1, k2, a, b, alpha = best[1]
        i = _position(order[e], batches[k1], slot_label, n, a)
        j = _position(order[e], batches[k2], slot_label, n, b)
        order[e, i], order[e, j] = order[e, j].clone(), order[e, i].clone()
        r[b] -= alpha
        r[a] += alpha
        moves += 1
    return order, moves


def _position(visits: torch.Tensor, batch: slice, labels: torch.Tensor, n: int,
              label: int) -> int:
    """The first position in ``batch`` of ``visits`` whose slot carries ``label``."""
    for position in range(batch.start, batch.stop):
        if int(labels[int(visits[position]) % n]) == label:
            return position
    raise ValueError(f"no slot labelled {label} in the batch")


@dataclass
class OrderModel:
    """The attack's order π for one restart, and its revisions (module docstring).

    ``order`` [E, n] is the tensor the replay reads (:meth:`OrderedReplay.visiting`): a
    revision writes it in place. ``objective(update)`` is J of the attack; ``evaluations``
    counts the replays the revisions cost (each is an objective evaluation of the budget).
    """

    observation: Observation
    replay: OrderedReplay
    labels: torch.Tensor
    objective: Callable[[list[torch.Tensor]], torch.Tensor]
    order: torch.Tensor
    evaluations: int = 0
    exchanges: int = 0
    kept: int = 0
    history: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, observation: Observation, replay: OrderedReplay, labels: torch.Tensor,
              objective: Callable[[list[torch.Tensor]], torch.Tensor], copies: int,
              device: torch.device) -> OrderModel:
        """The stratified order over ``labels`` (the n recovered ones), on ``device``."""
        batches = replay.epoch_batches(observation.num_images)
        order = stratified_order(labels.cpu(), batches, replay.epochs(), copies).to(device)
        return cls(observation, replay.visiting(order), labels, objective, order)

    def revise(self, images: torch.Tensor) -> None:
        """One revision at the candidates ``images`` [copies·n, C, H, W]: the exchanges the bias
        residual asks for, kept when they lower J (two replays)."""
        _, bias = last_layer_indices(self.observation)
        rows = self.labels.repeat(images.shape[0] // self.labels.numel())
        before = self._update(images, rows)
        self.evaluations += 1
        if bias is None:
            self.history.append("no output bias: order kept")
            return
        tau = float(self.observation.learning_rate or 1.0)
        residual = (self.observation.update[bias].detach() - before[bias]) / tau
        batches = self.replay.epoch_batches(self.observation.num_images)
        weights = self.replay.step_weights(self.observation.num_images)
        proposed, moves = exchange(self.order.cpu(), self.labels, residual, weights, batches,
                                   self.observation.num_classes)
        if moves == 0:
            self.history.append("no exchange shrinks the bias residual")
            return
        old = self.order.clone()
        self.order.copy_(proposed.to(self.order.device))
        after = self._update(images, rows)
        self.evaluations += 1
        if float(self.objective(after)) < float(self.objective(before)):
            self.exchanges += moves
            self.kept += 1
            self.history.append(f"{moves} exchange(s) kept")
        else:
            self.order.copy_(old)
            self.history.append(f"{moves} exchange(s) undone: the objective did not fall")

    def _update(self, images: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
        with torch.enable_grad():
            return [u.detach() for u in self.replay(images.detach(), rows)]
