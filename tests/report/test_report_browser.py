"""report.html in a real headless browser: it loads offline, logs no console error, every image renders.

Optional environment (docs/report.md, "Browser check"): Debian's ``chromium``
and ``chromium-driver`` packages plus ``selenium`` from PyPI. Without them the
test skips and says which part is missing.
"""

import shutil

import pytest

from pytest_afd import report
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"
PAGE_LOAD_TIMEOUT_S = 120  # a bound, not a timing: the page is local


def _browser_or_skip():
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
    )
    binary = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if binary is None:
        pytest.skip("no chromium binary on PATH (apt-get install chromium)")
    driver_path = shutil.which(DRIVER)
    if driver_path is None:
        pytest.skip("no chromedriver on PATH (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 # Offline: every host name fails to resolve, so nothing can be fetched.
                 "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=driver_path)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    return driver


@pytest.fixture
def rendered_report(tmp_path):
    workload = make_workload("uniform", **SMALL)
    late = "2026-12-01T12:00:00+00:00"
    for policy, wall, status in (("request_boundary", 1.0, "passed"),
                                 ("token_balanced", 0.8, "failed")):
        doc = make_result(f"stage_a/u/{policy}", "stage_a", workload, policy, wall_s=wall,
                          skewed=True)
        write(tmp_path, stamped(doc, status, session="s", created_at=late, reason="boom"))
    report.render(tmp_path, tmp_path / "out")
    # Only the page travels: a copy alone in a fresh directory must still be whole.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tmp_path / "out" / "report.html", alone / "report.html")
    return alone / "report.html"


def test_report_html_loads_offline_without_errors_and_every_image_renders(rendered_report):
    driver = _browser_or_skip()
    try:
        driver.get(rendered_report.as_uri())
        images = driver.execute_script(
            "return Array.from(document.images).map(function (i) {"
            "return [i.alt, i.complete, i.naturalWidth]; });"
        )
        assert images, "the report has no images"
        for alt, complete, width in images:
            assert complete and width > 0, f"image {alt!r} did not render"
        header = driver.find_element("css selector", "table.sortable th")
        header.click()  # the sorting script runs without an error
        assert header.get_attribute("data-order") == "asc"
        assert driver.find_elements("css selector", "tr.bad"), "the failed row is not highlighted"
        assert driver.find_elements("css selector", "nav#contents a[href='#stage_a']")
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()
