"""Auditing Flower's SecAgg+ rounds: the server, and so the audit, holds only the aggregate."""
