"""The honest-but-curious server against a text victim: what it publishes, the attack run, its
records.
"""
