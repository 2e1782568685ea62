"""Scoring reconstructions inside the victim, where the truth is: rounds, features, the Fisher
ceiling, text, the score budget and report precision.
"""
