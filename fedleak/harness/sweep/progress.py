"""Progress of a sweep: one bar for the whole sweep, one per point being measured.

Measuring code reports through a :class:`ProgressSink` (``start``, ``advance``, ``end`` per
point). In the sweep's own process that is a :class:`TqdmProgress`; a worker process of
``--jobs N`` gets a :class:`QueueProgress` that forwards the same events to the main process,
which replays them on its bars, so parallel points never draw over each other.
"""

from __future__ import annotations

from typing import Any, Protocol

from tqdm import tqdm


class ProgressSink(Protocol):
    """Where a point's progress goes."""

    def start(self, point_id: str, label: str, total: int) -> None: ...

    def advance(self, point_id: str, text: str) -> None: ...

    def end(self, point_id: str, line: str) -> None: ...


class TqdmProgress:
    """Bars on the terminal: the sweep (points) at the top, active points below it.

    With ``enabled=False`` nothing is drawn, but each finished point's line is still printed.
    """

    def __init__(self, total: int, done: int, enabled: bool = True,
                 echo: Any = print) -> None:
        self.enabled = enabled
        self.echo = echo
        self.overall = tqdm(total=total, initial=done, desc="sweep", unit="point",
                            dynamic_ncols=True, disable=not enabled)
        self._bars: dict[str, tqdm] = {}
        self._positions: dict[str, int] = {}

    def start(self, point_id: str, label: str, total: int) -> None:
        taken = set(self._positions.values())
        position = next(i for i in range(1, len(taken) + 2) if i not in taken)
        self._positions[point_id] = position
        self._bars[point_id] = tqdm(total=total, desc=label[:40], unit="step", leave=False,
                                    position=position, dynamic_ncols=True,
                                    disable=not self.enabled)

    def advance(self, point_id: str, text: str) -> None:
        bar = self._bars.get(point_id)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(text[:60])

    def end(self, point_id: str, line: str) -> None:
        self._positions.pop(point_id, None)
        bar = self._bars.pop(point_id, None)
        if bar is not None:
            bar.close()
        self.overall.update(1)
        if self.enabled:
            tqdm.write(line)
        else:
            self.echo(line)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self.overall.close()


class QueueProgress:
    """Forwards events to a multiprocessing queue (inside a ``--jobs`` worker)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def start(self, point_id: str, label: str, total: int) -> None:
        self.queue.put(("start", point_id, label, total))

    def advance(self, point_id: str, text: str) -> None:
        self.queue.put(("advance", point_id, text))

    def end(self, point_id: str, line: str) -> None:
        self.queue.put(("end", point_id, line))


def replay(event: tuple[Any, ...], sink: ProgressSink) -> None:
    """Apply an event from a :class:`QueueProgress` to ``sink``."""
    kind, *args = event
    getattr(sink, kind)(*args)
