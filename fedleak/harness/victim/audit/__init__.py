"""The victim's side of the audit games: canaries, claims, coverage, plans, sessions and the
informed-adversary game; only the victim holds the coins.
"""
