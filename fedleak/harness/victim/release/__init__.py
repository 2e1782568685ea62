"""The victim's side of a model release (Haim et al. 2022): train, publish θ, score candidates."""
