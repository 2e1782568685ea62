"""``fedleak victim serve``: the command, its options by concern, and what it derives from them."""
