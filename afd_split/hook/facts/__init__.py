"""What the hook knows of upstream: pinned headers, drift checks, the patch marker, errors."""
