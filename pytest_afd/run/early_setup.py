"""Keep pytest's rootdir where the test paths put it when an ``--afd-*`` value is a path.

pytest determines the rootdir and reads the ini file before it loads any plugin
(``Config.parse``: ``determine_setup`` runs on the first parse, which knows only
pytest's own options). There ``--afd-golden-dir /some/dir`` is an unknown flag
followed by a free argument, and a free argument that exists is taken as a test
path: with no test path on the command line, ``/some/dir`` becomes the rootdir,
the repository's ini file (``addopts``, markers, ``testpaths``) is dropped and
case ids change. The ``--flag=value`` form never had the problem.

Once the plugin is loaded, its options are known and ``known_args_namespace``
holds the real free arguments. :func:`repair_setup` determines the setup again
from them; if it differs and pytest had found no ini file, it installs the
real one before any conftest loads, exactly as ``Config.parse`` would have
(rootdir, ini values, ``addopts``, ``minversion``, ``pythonpath``,
``confcutdir``). When pytest had already read an ini file next to the value
(its ``addopts`` are applied), it is a usage error naming the values.

Read from pytest 9.0.3 (``_pytest/config/__init__.py`` ``Config.parse``,
``_pytest/config/findpaths.py`` ``determine_setup``); the private ``Config``
fields set here are the ones ``Config.parse`` sets. ``tests/plugin/
test_plugin_options_cli.py`` runs real sessions through this path, so a pytest
that changes them fails there, not silently.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Sequence

import pytest
from _pytest.config.findpaths import determine_setup


def option_values(args: Sequence[str], value_flags: Iterable[str]) -> list[str]:
    """The values given space-separated after one of ``value_flags`` (``--flag value``)."""
    flags = set(value_flags)
    return [value for flag, value in itertools.pairwise(args) if flag in flags]


def repair_setup(config: pytest.Config, args: list[str], value_flags: Iterable[str]) -> None:
    """Redo pytest's setup when a space-separated option value moved the rootdir (see module doc)."""
    values = option_values(args, value_flags)
    if not values:
        return
    namespace = config.known_args_namespace
    rootpath, inipath, inicfg, ignored = determine_setup(
        inifile=namespace.inifilename,
        override_ini=namespace.override_ini,
        args=namespace.file_or_dir,
        rootdir_cmd_arg=namespace.rootdir or None,
        invocation_dir=config.invocation_params.dir,
    )
    if (rootpath, inipath) == (config.rootpath, config.inipath):
        return
    if config.inipath is not None:  # its addopts are already in args: too late to undo
        raise pytest.UsageError(
            f"the option value(s) {values} were read by pytest as test paths before plugins "
            f"load, which moved the rootdir to {config.rootpath} (else {rootpath}); write the "
            "option as --flag=value"
        )
    config._rootpath = rootpath
    config._inipath = inipath
    config._inicfg = inicfg
    config._ignored_config_files = ignored
    config._inicache.clear()
    config._parser.extra_info["rootdir"] = str(rootpath)
    config._parser.extra_info["inifile"] = str(inipath)  # "None" when there is none, as pytest
    args[:] = config._validate_args(config.getini("addopts"), "via addopts config") + args
    confcutdir_given = namespace.confcutdir not in (None, str(config.rootpath))
    config.known_args_namespace = config._parser.parse_known_args(
        args, namespace=copy.copy(config.option)
    )
    config._checkversion()
    config._configure_python_path()
    config.pluginmanager.consider_preparse(args, exclude_only=False)
    if not confcutdir_given:
        config.known_args_namespace.confcutdir = str(
            inipath.parent if inipath is not None else rootpath
        )
