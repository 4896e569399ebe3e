"""Seeded faults (the gates' own mutation check) and the fault-check command."""
