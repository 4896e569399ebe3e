"""The harness's ground floor: the backend protocol, markers, hook specs and the absent-value convention."""
