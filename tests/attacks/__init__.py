"""Tests of fedleak.attacks, laid out as the package: the contracts here, a folder per family."""
