"""Defense sweeps: a grid of defense settings measured against real victim processes.

- :mod:`~fedleak.harness.sweep.grid.spec`: a TOML spec expanded into points.
- :mod:`~fedleak.harness.sweep.grid.points`: :class:`Point` (one measurement setting, with a stable
  id) and the typed settings of the grid's axes.
- :mod:`~fedleak.harness.sweep.store`: the crash-safe SQLite results store of a run folder.
- :mod:`~fedleak.harness.sweep.measure.measurements`: the typed records the store keeps.
- :mod:`~fedleak.harness.sweep.measure.leakage`: attack K private batches of a point's victim.
- :mod:`~fedleak.harness.sweep.measure.utility`: test accuracy of federated training through the
  defended path (the utility a defense costs).
- :mod:`~fedleak.harness.sweep.measure.checkpoints`: trained checkpoints of ``trained = true``
  points.
- :mod:`~fedleak.harness.sweep.runner`: measures the points (attack, then utility), skipping
  what the store already holds, optionally in parallel.
- :mod:`~fedleak.harness.sweep.results`: the store read back as one flat row per point.
- :mod:`~fedleak.harness.sweep.report.folder`: privacy–utility charts, image grids, CSV and HTML.
"""
