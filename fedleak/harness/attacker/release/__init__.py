"""The server's side of the release threat model: the KKT attack on a released model, its records
and plots.
"""
