"""The order a shuffling FedAvg user visited its images in, as a variable of the attack.

A FedAvg user that shuffles (``DataLoader(shuffle=True)``) visits its n images in a new secret
order every epoch: E epochs of K mini-batches of B, L = E·K local SGD steps. Dimitrov et al.
("Data Leakage in Federated Averaging", TMLR 2022, Sec. 4) replay each epoch on its own copy of
the candidate images (:mod:`fedleak.attacks.optimisation.fedavg.epochs`), which absorbs the order
*within* the slots — but the label of each slot is fixed, so which labels shared a mini-batch stays
a guess (their code: a random one). This module makes that guess a variable of the attack. Slot i of
every copy carries the recovered label ŷ_i, and epoch e visits the rows of its copy in an
order π_e the attack chooses: batch k of epoch e is rows π_e[kB : (k+1)B]. For every order the
user drew there are images x and orders π whose replay *is* the user's update (its images at
the slots, π_e its permutation), so the replay family contains the truth: the order is
unknown, and modelled.

**Estimating π from the output layer.** With every step's gradient taken at θ_k (first
order), the last layer's bias moves by::

    Δb ≈ −τ Σ_s w_s (p̄_s − h_s),      h_s = (1/|B_s|) Σ_{i ∈ B_s} e_{ŷ_i},

with p̄_s the mean softmax of step s's batch and w_s the step's weight (momentum weighs early
steps more: w_s = Σ_{m ≥ s} μ^{m−s}, :meth:`~fedleak.attacks.replay_contract.OrderedReplay.
step_weights`). Replaying the current candidates (x, π) gives Δb(x, π); where their softmax is
close to the user's (an untrained model predicts nearly the same for every image), the
residual::

    r = (Δb* − Δb(x, π)) / τ  ≈  Σ_s w_s (h*_s − h_s)

says how the label make-up of the batches must change. Exchanging slot i (label a, batch s)
with slot j (label b, batch t) of one epoch changes Σ_s w_s h_s by::

    v = (e_b − e_a) (w_s/|B_s| − w_t/|B_t|),

so :func:`exchange` applies, greedily, the exchange with the largest ‖r‖² − ‖r − v‖² > 0 until
none is left, and escapes the local minima that leaves by random kicks (an iterated local
search on this linear model, which costs no replay). With equal weights and batch sizes
(plain SGD) v = 0: the bias cannot tell the batches apart, the order stays where it
started — :func:`stratified_order`, every label dealt evenly over the batches, the expected
make-up of a random shuffle. A revision is kept only if
the replayed output bias at the current images comes closer to the observed one
(:class:`OrderModel`: the linear model's errors — a trained model's softmax moving with the
images, momentum's drift — cannot make the order worse by that measure).
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
#: random restarts of the exchange search (:func:`exchange`)
KICKS = 64


def stratified_order(labels: torch.Tensor, batches: Sequence[slice], epochs: int, copies: int
                     ) -> torch.Tensor:
    """Return the initial order [E, n].

    In every epoch the slots, sorted by label, dealt round robin over the batches that still have
    room (each label spread evenly); epoch e visits the rows of copy e (``copies`` = E) or of the
    one copy (``copies`` = 1).
    """
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
             weights: Sequence[float], batches: Sequence[slice], num_classes: int,
             kicks: int = KICKS) -> tuple[torch.Tensor, int]:
    """Return the order after the exchanges that shrink ‖r − Σ v‖² most.

    The order after the exchanges that shrink ‖r − Σ v‖² most (module docstring), and how many it
    differs from ``order`` by. ``order`` [E, n] indexes rows whose label is ``labels[row % n]``;
    ``weights`` has one entry per local step (E·K). A greedy descent (the best exchange each time)
    ends in a local minimum; ``kicks`` times two random exchanges are made and the descent run
    again, the best order kept (an iterated local search on the linear model: no replay, so it costs
    no objective evaluation).
    """
    slot_label = labels.detach().cpu()
    n = order.shape[1]
    sizes = torch.tensor([b.stop - b.start for b in batches], dtype=torch.float64)
    per_step = torch.tensor(list(weights), dtype=torch.float64).view(-1, len(batches)) / sizes
    # one row per (epoch, batch): the label counts, kept as the search moves labels
    start = torch.stack([torch.stack([torch.bincount(slot_label[order[e, b] % n],
                                                     minlength=num_classes)
                                      for b in batches]) for e in range(order.shape[0])])
    r0 = residual.detach().double().cpu()
    best_counts, best_r = _descend(start.clone(), r0.clone(), per_step)
    generator = torch.Generator().manual_seed(0)
    for _ in range(kicks):
        counts, r = best_counts.clone(), best_r.clone()
        for _ in range(2):
            _random_exchange(counts, r, per_step, generator)
        counts, r = _descend(counts, r, per_step)
        if float(r.square().sum()) < float(best_r.square().sum()) * (1 - MIN_GAIN):
            best_counts, best_r = counts, r
    return _realise(order, slot_label, best_counts, batches, n)


def _descend(counts: torch.Tensor, r: torch.Tensor, per_step: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy exchanges on ``counts`` [E, K, C] while one shrinks ‖r‖²; r moves along."""
    epochs, k, c = counts.shape
    for _ in range(int(counts.sum())):
        # alpha[e, k1, k2] = w/|B| of k1 minus that of k2; gain[e,k1,k2,a,b] of moving a
        # label-a slot from k1 to k2 and a label-b slot from k2 to k1
        alpha = per_step.view(epochs, k, 1) - per_step.view(epochs, 1, k)
        rb_ra = (r.view(1, -1) - r.view(-1, 1)).view(1, 1, 1, c, c)
        gain = (2 * alpha.view(epochs, k, k, 1, 1) * rb_ra
                - 2 * alpha.square().view(epochs, k, k, 1, 1))
        allowed = (counts.view(epochs, k, 1, c, 1) > 0) & (counts.view(epochs, 1, k, 1, c) > 0)
        allowed &= ~torch.eye(c, dtype=torch.bool).view(1, 1, 1, c, c)
        gain = torch.where(allowed, gain, torch.full_like(gain, -torch.inf))
        value, flat = gain.view(-1).max(0)
        if not float(value) > MIN_GAIN * float(r.square().sum()):
            break
        e, k1, k2, a, b = torch.unravel_index(flat, gain.shape)
        _apply(counts, r, float(alpha[e, k1, k2]), int(e), int(k1), int(k2), int(a), int(b))
    return counts, r


def _apply(counts: torch.Tensor, r: torch.Tensor, alpha: float, e: int, k1: int, k2: int,
           a: int, b: int) -> None:
    """Move a label-a slot from batch k1 to k2 and a label-b slot back (epoch e)."""
    counts[e, k1, a] -= 1
    counts[e, k2, a] += 1
    counts[e, k2, b] -= 1
    counts[e, k1, b] += 1
    r[b] -= alpha
    r[a] += alpha


def _random_exchange(counts: torch.Tensor, r: torch.Tensor, per_step: torch.Tensor,
                     generator: torch.Generator) -> None:
    """One exchange of two differently labelled slots between two random batches."""
    epochs, k, _ = counts.shape
    if k < 2:
        return
    e = int(torch.randint(epochs, (1,), generator=generator))
    k1, k2 = torch.randperm(k, generator=generator)[:2].tolist()
    a_options = (counts[e, k1] > 0).nonzero().view(-1)
    b_options = (counts[e, k2] > 0).nonzero().view(-1)
    a = int(a_options[torch.randint(len(a_options), (1,), generator=generator)])
    b = int(b_options[torch.randint(len(b_options), (1,), generator=generator)])
    if a != b:
        _apply(counts, r, float(per_step[e, k1] - per_step[e, k2]), e, k1, k2, a, b)


def _realise(order: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor,
             batches: Sequence[slice], n: int) -> tuple[torch.Tensor, int]:
    """Realise the label ``counts`` per batch, moving as few slots as it can.

    An order with the label ``counts`` per batch that keeps as many slots where they were as it can;
    and how many slots it moved.
    """
    out = order.clone()
    moved = 0
    for e in range(order.shape[0]):
        pools: dict[int, list[int]] = {}
        placed: list[list[int]] = []
        for k, batch in enumerate(batches):
            keep, need = [], counts[e, k].clone()
            for row in order[e, batch].tolist():
                y = int(labels[row % n])
                if need[y] > 0:
                    need[y] -= 1
                    keep.append(row)
                else:
                    pools.setdefault(y, []).append(row)
            placed.append(keep)
        for k, batch in enumerate(batches):
            have = torch.bincount(labels[torch.tensor(placed[k], dtype=torch.long) % n],
                                  minlength=counts.shape[2]) if placed[k] else \
                torch.zeros(counts.shape[2], dtype=torch.long)
            for y, missing in enumerate((counts[e, k] - have).tolist()):
                for _ in range(int(missing)):
                    placed[k].append(pools[y].pop())
                    moved += 1
            out[e, batch] = torch.tensor(placed[k], dtype=order.dtype)
    return out, moved


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
        """Return the stratified order over ``labels`` (the n recovered ones), on ``device``."""
        batches = replay.epoch_batches(observation.num_images)
        order = stratified_order(labels.cpu(), batches, replay.epochs(), copies).to(device)
        return cls(observation, replay.visiting(order), labels, objective, order)

    def revise(self, images: torch.Tensor) -> None:
        """One revision at the candidates ``images`` [copies·n, C, H, W].

        The exchanges the bias residual asks for, kept when the *replayed* bias (not its linear
        model) comes closer to the observed one (two replays).
        """
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
        target = self.observation.update[bias].detach()
        if float((target - after[bias]).norm()) < float((target - before[bias]).norm()):
            self.exchanges += moves
            self.kept += 1
            self.history.append(f"{moves} slot(s) moved")
        else:
            self.order.copy_(old)
            self.history.append(f"{moves} slot(s) moved back: the replayed bias did not come "
                                "closer")

    def _update(self, images: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
        with torch.enable_grad():
            return [u.detach() for u in self.replay(images.detach(), rows)]
