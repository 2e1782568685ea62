"""Integration tests: real victim, defense and attacker processes on loopback, hostile clients."""
