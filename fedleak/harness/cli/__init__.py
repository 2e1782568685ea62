"""The ``fedleak`` command (click): one module per command group. The top room: it may
import every other room, and nothing imports it."""
