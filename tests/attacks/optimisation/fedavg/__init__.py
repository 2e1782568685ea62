"""Tests of the FedAvg attacks: unrolled local epochs and the shuffled order."""
