"""Is this AFD-plugin checkout installable in this image? (the CAM wheel's Python tag).

Each afd-plugin ref ships one prebuilt CAM operator wheel,
``afd_plugin/connectors/npu/bin/umdk_cam_op_lib-<version>-cpXY-cpXY-<platform>.whl``
(release/v0.19.1rc1: cp311, main and update/v0.26.0: cp312; see
:data:`pytest_afd.backends.vllm_ascend.recipe.CAM_WHEELS`). pip refuses a wheel
for another Python with "is not a supported wheel on this platform"; this
check says which ref and which image disagree before anything is installed.

``python -m pytest_afd.backends.vllm_ascend.compat <afd-plugin dir>`` exits 2
with the reason when they do not match.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

CAM_WHEEL_DIR = Path("afd_plugin/connectors/npu/bin")
CAM_WHEEL_GLOB = "umdk_cam_op_lib-*.whl"
_PYTHON_TAG = re.compile(r"-cp(\d)(\d+)-")
EXIT_INCOMPATIBLE = 2


class IncompatiblePlugin(RuntimeError):
    """The plugin ref's CAM wheel was built for another Python than this image's."""


def wheel_python(name: str) -> tuple[int, int]:
    """(major, minor) from a wheel file name's ``cpXY`` tag."""
    match = _PYTHON_TAG.search(name)
    if match is None:
        raise IncompatiblePlugin(f"CAM wheel {name!r} has no cpXY Python tag")
    return int(match.group(1)), int(match.group(2))


def check_plugin_checkout(plugin_dir: Path, python: Sequence[int]) -> str:
    """The CAM wheel to install; raises IncompatiblePlugin naming both versions."""
    wheels = sorted((plugin_dir / CAM_WHEEL_DIR).glob(CAM_WHEEL_GLOB))
    if len(wheels) != 1:
        raise IncompatiblePlugin(f"{plugin_dir / CAM_WHEEL_DIR}: expected one {CAM_WHEEL_GLOB}, "
                                 f"found {[wheel.name for wheel in wheels]}")
    wanted = wheel_python(wheels[0].name)
    have = (int(python[0]), int(python[1]))
    if wanted != have:
        raise IncompatiblePlugin(
            f"the AFD plugin checkout at {plugin_dir} ships {wheels[0].name} for Python "
            f"{wanted[0]}.{wanted[1]}, but this image runs Python {have[0]}.{have[1]}: pick the "
            "plugin ref that matches the image (release/v0.19.1rc1 for the v0.19.1rc1 image)"
        )
    return str(wheels[0])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m pytest_afd.backends.vllm_ascend.compat AFD_PLUGIN_DIR\n")
        return EXIT_INCOMPATIBLE
    try:
        print(check_plugin_checkout(Path(args[0]), sys.version_info))
    except IncompatiblePlugin as error:
        sys.stderr.write(f"afd-plugin/image mismatch: {error}\n")
        return EXIT_INCOMPATIBLE
    return 0


if __name__ == "__main__":
    sys.exit(main())
