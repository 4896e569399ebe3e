"""NPU topology strings: the grammar, the role layouts and what they resolve to."""
