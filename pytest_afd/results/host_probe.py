"""Probe the host for the manifest's software section: what is installed and where.

Versions come from ``importlib.metadata`` (with the VCS commit from PEP 610
``direct_url.json`` when a package was installed from git), CANN from the
toolkit's ``ascend_toolkit_install.info``, driver/firmware from the Ascend
``version.info`` files or ``npu-smi``, the harness commit from git, and the
container digest from the environment. Whatever cannot be found is
``absent(...)`` saying why. Assembly (topology, model, hardware, digest) is
:mod:`pytest_afd.results.manifest`'s.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_afd.core.absent import absent

ASCEND_ROOT = Path("/usr/local/Ascend")
DRIVER_VERSION_FILE = ASCEND_ROOT / "driver" / "version.info"
FIRMWARE_VERSION_FILE = ASCEND_ROOT / "firmware" / "version.info"
DEFAULT_TOOLKIT_HOME = ASCEND_ROOT / "ascend-toolkit" / "latest"
TOOLKIT_INFO_GLOB = "*/ascend_toolkit_install.info"
# Environment variables CI sets when the facts cannot be discovered from inside.
ENV_CONTAINER_DIGEST = "AFD_CONTAINER_DIGEST"
ENV_AFD_COMMIT = "AFD_PLUGIN_COMMIT"
ENV_HARNESS_COMMIT = "AFD_HARNESS_COMMIT"
ENV_TOOLKIT_HOME = "ASCEND_TOOLKIT_HOME"
SUBPROCESS_TIMEOUT_S = 10
AFD_DISTRIBUTIONS = ("afd-plugin", "afd_plugin")
VLLM_DISTRIBUTIONS = ("vllm",)
VLLM_ASCEND_DISTRIBUTIONS = ("vllm-ascend", "vllm_ascend")
TORCH_NPU_DISTRIBUTIONS = ("torch-npu", "torch_npu")


def package_revision(distributions: tuple[str, ...]) -> str | dict[str, Any]:
    """``version`` or ``version+git.<commit>`` of the first installed distribution name."""
    for name in distributions:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        version = dist.version
        direct_url = dist.read_text("direct_url.json")
        if direct_url:
            commit = json.loads(direct_url).get("vcs_info", {}).get("commit_id")
            if commit:
                return f"{version}+git.{commit}"
        return version
    return absent(f"{distributions[0]} is not installed in {sys.prefix}")


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            command,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_commit(path: Path) -> str | dict[str, Any]:
    """The commit of the checkout holding ``path`` (``-dirty`` when it has local changes)."""
    if shutil.which("git") is None:
        return absent("git is not installed")
    described = _run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=path)
    return described or absent(f"{path} is not inside a git checkout")


def read_key_value(path: Path, key: str) -> str | None:
    """``key=value`` lookup in Ascend ``*.info`` files (case-insensitive key)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower():
            return value.strip().strip('"') or None
    return None


def cann_version(environ: Mapping[str, str]) -> str | dict[str, Any]:
    home = Path(environ.get(ENV_TOOLKIT_HOME, DEFAULT_TOOLKIT_HOME))
    for info in sorted(home.glob(TOOLKIT_INFO_GLOB)):
        version = read_key_value(info, "version")
        if version:
            return version
    return absent(f"no CANN toolkit install info under {home} (set {ENV_TOOLKIT_HOME})")


def _npu_smi_field(label: str) -> str | None:
    if shutil.which("npu-smi") is None:
        return None
    text = _run(["npu-smi", "info", "-t", "board", "-i", "0"])
    for line in (text or "").splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == label.lower():
            return value.strip() or None
    return None


def driver_version() -> str | dict[str, Any]:
    version = read_key_value(DRIVER_VERSION_FILE, "Version") or _npu_smi_field("Software Version")
    return version or absent(
        f"no Ascend driver: {DRIVER_VERSION_FILE} missing and npu-smi not found"
    )


def firmware_version() -> str | dict[str, Any]:
    version = read_key_value(FIRMWARE_VERSION_FILE, "Version") or _npu_smi_field("Firmware Version")
    return version or absent(
        f"no Ascend firmware: {FIRMWARE_VERSION_FILE} missing and npu-smi not found"
    )


def _from_env(environ: Mapping[str, str], name: str, reason: str) -> str | dict[str, Any]:
    value = environ.get(name, "").strip()
    return value or absent(reason)


def collect_software(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    harness_commit = env.get(ENV_HARNESS_COMMIT, "").strip() or git_commit(
        Path(__file__).resolve().parent
    )
    afd_commit = env.get(ENV_AFD_COMMIT, "").strip() or package_revision(AFD_DISTRIBUTIONS)
    return {
        "harness_version": package_revision(("pytest-afd",)),
        "harness_commit": harness_commit,
        "afd_commit": afd_commit,
        "vllm_revision": package_revision(VLLM_DISTRIBUTIONS),
        "vllm_ascend_revision": package_revision(VLLM_ASCEND_DISTRIBUTIONS),
        "container_digest": _from_env(
            env,
            ENV_CONTAINER_DIGEST,
            f"{ENV_CONTAINER_DIGEST} is not set (not a pinned container run)",
        ),
        "driver_version": driver_version(),
        "firmware_version": firmware_version(),
        "cann_version": cann_version(env),
        "python_version": platform.python_version(),
        "torch_version": package_revision(("torch",)),
        "torch_npu_version": package_revision(TORCH_NPU_DISTRIBUTIONS),
        "numpy_version": package_revision(("numpy",)),
        "platform": platform.platform(),
    }
