"""Token-balanced two-ubatch split path for AFD prefill (framework-neutral)."""
