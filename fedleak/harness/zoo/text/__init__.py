"""Text for federations: the bundled corpus and tokenizer, a user's own text, transformers built
from configs, secret-sharer canaries.
"""
