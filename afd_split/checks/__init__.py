"""The checks layer: where a split is validated (imports the plan layer only).

``requests`` / ``request_checks`` / ``diagnosis`` hold the request-level invariants and the
errors that name the broken one, ``tokens`` / ``token_runs`` the token-level slot checks,
``support`` the configurations the split refuses, ``metadata`` the framework-neutral batch form.
"""
