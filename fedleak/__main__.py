"""``python -m fedleak`` runs the ``fedleak`` command."""

from fedleak.harness.cli.main import main

main(prog_name="fedleak")
