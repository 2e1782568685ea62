"""Shuffled local epochs: one copy of the candidates per epoch, and merging the copies.

A FedAvg user that shuffles (``DataLoader(shuffle=True)``) visits its n images in a new order
every epoch, from a generator the server never sees. With one mini-batch per epoch the order
does not matter; with several it does, and a replay in a fixed order is not the user's update.
Dimitrov et al. ("Data Leakage in Federated Averaging", TMLR 2022, Sec. 4) reconstruct one copy
x^(e) of the n images per epoch e, each replayed in order as that epoch — any order the user
drew is one assignment of its images to the copy's slots, so the replay is the user's update
for some assignment — and tie the copies together:

- an *epoch-consistency* prior (their "order-invariant" prior, the ``l2_mean`` form): every
  permutation-invariant summary of an epoch must be the same, here the mean image
  m_e = (1/n) Σ_i x_i^(e):

      R_epoch(x) = (1/E²) Σ_{e,e'} mean_pixels (m_e − m_{e'})² = 2 mean_pixels Var_e(m_e)

  (:func:`epoch_consistency`, the ``epoch`` prior of :mod:`fedleak.attacks.optimisation.priors`);
- at the end, *matching across epochs*: each copy's images are matched one-to-one to copy 0's
  (minimum total squared distance, images of the same recovered label only) and the matched
  images are averaged (:func:`merge_epochs`).

The labels of slot i are the same in every copy (the recovered multiset in one order), as in
the authors' code; which labels shared a mini-batch is therefore the attack's guess, which is
the part of the user's order this model does not recover.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.replay_contract import Replay


def epoch_copies(observation: Observation) -> int:
    """Return how many copies of the n images the observation's replay takes.

    How many copies of the n images the observation's replay takes (1 unless the user's unseen order
    matters over several epochs: :meth:`Replay.epoch_copies
    <fedleak.attacks.replay_contract.Replay.epoch_copies>`; 1 for a plain replay).
    """
    simulate = observation.simulate
    return int(simulate.epoch_copies()) if isinstance(simulate, Replay) else 1


def with_epoch_copies(observation: Observation, labels: torch.Tensor, copies: int
                      ) -> tuple[Observation, torch.Tensor]:
    """Return what the optimiser works on when the replay takes ``copies`` per-epoch copies.

    The observation with ``copies × n`` images to draw, and the labels of every copy (the recovered
    ones, in the same order in each).
    """
    if copies == 1:
        return observation, labels
    return (dataclasses.replace(observation, num_images=copies * observation.num_images),
            labels.repeat(copies))


def epoch_consistency(images: torch.Tensor, copies: int) -> torch.Tensor:
    """Return R_epoch of the module docstring for ``images``.

    R_epoch of the module docstring for ``images`` [..., copies·n, C, H, W] (leading dimensions,
    e.g. restarts, kept): the mean over pixels of twice the variance, across the copies, of each
    copy's mean image.
    """
    lead = images.shape[:-4]
    per_copy = images.reshape(*lead, copies, -1, *images.shape[-3:]).mean(-4)
    spread = per_copy - per_copy.mean(-4, keepdim=True)
    return 2 * spread.square().mean(dim=(-4, -3, -2, -1))


def merge_epochs(images: torch.Tensor, labels: torch.Tensor, copies: int) -> torch.Tensor:
    """Merge the per-epoch copies in ``images`` into the n images.

    The n images from ``images`` [copies·n, C, H, W] (copy e = rows e·n … e·n + n − 1, slot i
    labelled ``labels[i]`` in every copy): every copy matched one-to-one to copy 0 (least squared
    distance, same label only; :func:`assignment`), then averaged.
    """
    if copies == 1:
        return images
    n = images.shape[0] // copies
    per_copy = images.detach().reshape(copies, n, -1)
    same = labels.view(-1, 1) == labels.view(1, -1)
    merged = per_copy[0].clone()
    for e in range(1, copies):
        cost = torch.cdist(per_copy[0], per_copy[e]).square()
        cost = torch.where(same, cost, torch.full_like(cost, math.inf))
        merged += per_copy[e][assignment(cost)]
    return (merged / copies).view(n, *images.shape[1:])


def assignment(cost: torch.Tensor) -> list[int]:
    """Solve the minimum-cost one-to-one assignment of the square ``cost`` matrix.

    The column matched to each row by a minimum-cost one-to-one assignment of the square ``cost``
    matrix (Kuhn–Munkres with potentials, O(n³); +inf forbids a pair): row i takes column
    ``result[i]``.
    """
    n = cost.shape[0]
    big = float(cost[torch.isfinite(cost)].abs().sum().item() + 1) if n else 1.0
    c = torch.where(torch.isfinite(cost), cost, torch.full_like(cost, big)).tolist()
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    matched, way = [0] * (n + 1), [0] * (n + 1)  # matched[j]: the row holding column j (1-based)
    for row in range(1, n + 1):
        matched[0], column = row, 0
        least, used = [math.inf] * (n + 1), [False] * (n + 1)
        while matched[column]:
            used[column] = True
            i, delta, nxt = matched[column], math.inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    reduced = c[i - 1][j - 1] - u[i] - v[j]
                    if reduced < least[j]:
                        least[j], way[j] = reduced, column
                    if least[j] < delta:
                        delta, nxt = least[j], j
            for j in range(n + 1):
                if used[j]:
                    u[matched[j]] += delta
                    v[j] -= delta
                else:
                    least[j] -= delta
            column = nxt
        while column:
            previous = way[column]
            matched[column] = matched[previous]
            column = previous
    result = [0] * n
    for j in range(1, n + 1):
        result[matched[j] - 1] = j - 1
    return result
