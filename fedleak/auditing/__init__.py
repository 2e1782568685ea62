"""Auditing: the maths that calibrates an attack from both sides (DESIGN.md, "Calibration").

Plain numpy/scipy/torch, no harness imports: reconstruction bounds from a mechanism's DP
(:mod:`~fedleak.auditing.reconstruction_bounds`), the Fisher-information ceiling on
reconstruction error (:mod:`~fedleak.auditing.fisher_information`), the baseline κ of a prior
(:mod:`~fedleak.auditing.prior_baseline`) and the statistics of repeated games
(:mod:`~fedleak.auditing.game_statistics`).
"""
