"""One patch file per upstream target (AGENTS.md); they never import each other."""
