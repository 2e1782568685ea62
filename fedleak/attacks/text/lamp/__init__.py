"""LAMP (Balunović et al., NeurIPS 2022) and TAG (Deng et al. 2021).

Text by continuous gradient matching on token embeddings and discrete moves.
"""
