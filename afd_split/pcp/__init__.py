"""The PCP layer: the rank-local zigzag layout of a split stage (imports the plan layer only).

``stage`` lays a stage's tokens over the PCP ranks, ``relayout`` / ``rows`` move rows between
the global and rank-local layouts, ``alignment`` holds the row alignment TP / SP / PCP need.
"""
