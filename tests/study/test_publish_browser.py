"""study.html in headless chromium, copied alone and offline: it renders and prints (optional).

Needs Debian's ``chromium`` (apt-get install chromium); skips naming it otherwise.
Slow (a browser start per check), so it runs with ``-m slow`` and in the nightly run.
"""

import re
import shutil
import struct
import subprocess

import pytest

from pytest_afd.study import publish
from tests.support import study_data as sd

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND")
BROWSER_LIMIT_S = 180  # a bound on a hung browser, not a timing
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
A4_WIDTH_PX = 794


def _png_size(data):
    assert data[:8] == PNG_SIGNATURE
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_study_html_renders_and_prints_offline(tmp_path):
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if browser is None:
        pytest.skip("no chromium binary on PATH (apt-get install chromium)")
    manifest = sd.make_manifest()
    study = sd.freeze_study(tmp_path, manifest)
    for doc in sd.planted_pairs(manifest=manifest):
        sd.write(tmp_path / "results", doc)
    assert publish.main([str(tmp_path / "results"), "--study", str(study), "--output",
                         str(tmp_path / "bundle")]) == 0
    alone = tmp_path / "alone"
    alone.mkdir()
    page = alone / "study.html"
    shutil.copy(tmp_path / "bundle" / "study.html", page)
    shot, pdf = tmp_path / "screen.png", tmp_path / "print.pdf"
    for output in (f"--screenshot={shot}", f"--print-to-pdf={pdf}"):
        subprocess.run([browser, *FLAGS, f"--window-size={A4_WIDTH_PX},1600", output,
                        page.as_uri()], check=True, capture_output=True, timeout=BROWSER_LIMIT_S)
    assert _png_size(shot.read_bytes()) == (A4_WIDTH_PX, 1600)
    printed = pdf.read_bytes()
    # Several pages: the whole study printed, not an empty or unloadable page.
    assert printed.startswith(b"%PDF") and len(re.findall(rb"/Type\s*/Page(?!s)", printed)) >= 2
