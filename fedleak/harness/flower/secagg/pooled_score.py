"""Scores of a SecAgg+ aggregate's reconstruction: every survivor's score of its own images,
pooled into one answer (floors included).

Each survivor receives the reconstruction of all N images, finds its own n_k among them and
scores those (:mod:`~fedleak.harness.flower.node.node_scoring`, ``aggregate``); :func:`pooled_score`
puts their per-image scores, counts and floors into one ``ScoreResponse``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from fedleak.harness.attacker.round_outcome import floors_of
from fedleak.harness.flower.score_answers import ScoreAnswer
from fedleak.harness.metrics.floors import FloorSummary, combined
from fedleak.harness.victim.victim_messages import floors_pb
from fedleak.v1 import victim_pb2 as pb

#: asks one node to score: ``node_score(round, node, images, labels, aggregate=, padding=)``
NodeScore = Callable[..., ScoreAnswer]


def pooled_score(node_score: NodeScore, server_round: int, counts: dict[int, int],
                 images: torch.Tensor | None, labels: list[int], padding: list[int],
                 details: dict[str, Any]) -> ScoreAnswer:
    """Every survivor scores the reconstruction of all N images against its own batch
    (finding its n_k images among them); their per-image scores pooled into one answer.

    Each node matches its images one-to-one within the reconstruction; two nodes may
    claim the same reconstructed image. When none is claimed twice, the pooled matching
    is one-to-one over all N images and so the optimal one; otherwise the pooled score
    is an upper bound, and ``details['matching']`` says how many were claimed twice."""
    pooled = pb.ScoreResponse()
    floors: list[FloorSummary] = []
    truths: list[torch.Tensor] = []
    refused, accuracy = [], []
    for node, entry in zip(counts, details["nodes"], strict=True):
        score, truth, unscored = node_score(server_round, node, images, labels,
                                            aggregate=True, padding=padding)
        if score is None or not score.images:
            entry["unscored"] = unscored or "the node returned no image scores"
            refused.append(node)
            continue
        entry["mean_psnr"], entry["mean_ssim"] = score.mean_psnr, score.mean_ssim
        offset = len(pooled.images)
        for s in score.images:
            pooled.images.add(index=offset + s.index, matched_index=s.matched_index,
                              psnr=s.psnr, ssim=s.ssim, mse=s.mse, padding=s.padding,
                              exact=s.exact, exact_index=s.exact_index,
                              floor_psnr=s.floor_psnr, floor_ssim=s.floor_ssim,
                              floor_guess=s.floor_guess)
        node_floors = floors_of(score)
        if node_floors is not None:
            floors.append(node_floors)
        pooled.exact += score.exact  # each node's own matching: an upper bound if two
        pooled.exact_psnr = score.exact_psnr  # nodes claimed one image (see above)
        pooled.successes += score.successes  # the same
        pooled.success_psnr = score.success_psnr
        if score.best_scored:
            pooled.best_psnr = max(pooled.best_psnr, score.best_psnr) \
                if pooled.best_scored else score.best_psnr
            pooled.best_scored = True
        if score.labels_scored:
            accuracy.append((score.label_accuracy, len(score.images)))
        truths.append(truth if truth is not None else torch.empty(0))
    if not pooled.images:
        return None, None, "no survivor scored the reconstruction: " + "; ".join(
            f"node {e['node']}: {e['unscored']}" for e in details["nodes"])
    n = len(pooled.images)
    pooled.mean_psnr = sum(s.psnr for s in pooled.images) / n
    pooled.mean_ssim = sum(s.ssim for s in pooled.images) / n
    pooled.mean_mse = sum(s.mse for s in pooled.images) / n
    if accuracy:
        pooled.labels_scored = True
        pooled.label_accuracy = sum(a * k for a, k in accuracy) / sum(k for _, k in accuracy)
    if len(floors) == len(details["nodes"]) - len(refused):  # every scoring node's floors
        floors_pb(pooled, combined(floors))
    shared = sum(1 for c in Counter(s.matched_index for s in pooled.images).values() if c > 1)
    details["matching"] = (
        "per node, one-to-one within each node; no reconstructed image claimed by two "
        "nodes, so one-to-one over all images" if not shared else
        f"per node, one-to-one within each node; {shared} reconstructed image(s) claimed "
        "by two or more nodes, so the pooled score is an upper bound")
    if refused:
        details["matching"] += f"; nodes {refused} did not score (their images are left out)"
    revealed = all(t.numel() for t in truths) and not refused
    return pooled, torch.cat(truths) if revealed else None, None
