"""Text attacks on transformer updates: DAGER (exact sentences from the span of attention
gradients), LAMP and TAG (gradient matching on continuous token embeddings), as plain torch
code over Hugging Face GPT-2/BERT models; nothing here knows the wire or the harness."""
