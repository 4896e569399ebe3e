"""The result document: its parts, manifest, stand-in labels, directories and shared state."""
