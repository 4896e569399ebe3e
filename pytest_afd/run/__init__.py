"""One pytest session of the harness: options, outcomes, writer, terminal, deployments and A/B runs."""
