"""The server's side of the audit and informed-adversary games, and their pictures."""
