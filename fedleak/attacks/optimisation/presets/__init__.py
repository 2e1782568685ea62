"""The named optimisation attacks, each a preset of the composed engine.

Inverting Gradients, DLG, Qian & Hansen, GradInversion.
"""
