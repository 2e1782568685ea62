"""The node side of the Flower bridge (what a ClientApp imports): fedleak's local update, its
defense mods and their publication, the batches kept for scoring, the score budget and node-side
scoring.
"""
