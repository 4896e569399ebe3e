"""Per-step planning for the engines, and the evidence lines each step writes."""
