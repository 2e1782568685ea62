"""``python -m fedleak`` runs the ``fedleak`` command."""

from fedleak.harness.cli import main

main(prog_name="fedleak")
