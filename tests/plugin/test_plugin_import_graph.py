"""No pytest_afd module imports the plugin module: its state lives in pytest_afd.run.session.

outcomes.py once imported pytest_afd.plugin lazily inside a method because the
plugin imported it back (an import cycle); suites imported it for ``afd_session``.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "pytest_afd.plugin"


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_nothing_in_the_package_or_the_suites_imports_the_plugin_module():
    paths = [p for p in (ROOT / "pytest_afd").rglob("*.py") if p.name != "plugin.py"]
    paths += list((ROOT / "suites").rglob("*.py"))
    offenders = sorted(str(p.relative_to(ROOT)) for p in paths if PLUGIN in imports_of(p))
    assert len(paths) > 50  # the scan saw the package
    assert offenders == []
