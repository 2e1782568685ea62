"""Checks of the repository as a whole: layering, module sizes, docs, README, spelling."""
