"""The plan layer: where a batch is cut into two ubatches (numpy only, the bottom of afd_split).

``planner.plan_split`` is the entry point; ``constraints`` / ``policies`` / ``cost`` decide the cut,
``types`` holds the plan records, ``agree`` checks that every rank planned the same split.
Nothing here imports the layers above (checks, pcp, engine, hook).
"""
