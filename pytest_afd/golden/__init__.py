"""Golden outputs: the store, its files, tolerance comparisons and the reference phase."""
