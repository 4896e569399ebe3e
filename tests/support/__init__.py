"""Helpers shared by the tests, imported one way: ``from tests.support.<module> import ...``.

Fixtures live in each area's ``conftest.py``; everything else a test needs beyond
pytest_afd and afd_split (runners, stand-in builders, reference re-implementations)
lives here.
"""
