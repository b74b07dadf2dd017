"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, which ``make test``
installs) driven by Selenium, for the tests of the browser pages."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def chromium_paths() -> tuple[str, str] | None:
    """``(browser, driver)`` when both are installed, else None."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return None if browser is None or driver is None else (browser, driver)


def require_chromium() -> tuple[str, str]:
    paths = chromium_paths()
    if paths is None:
        pytest.skip("chromium and chromium-driver are not installed (make test installs them)")
    return paths


@contextmanager
def chrome(width: int = 1360, height: int = 900) -> Iterator[Any]:
    """A headless Chromium session (its console log readable with ``get_log("browser")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = require_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(check: Callable[[], T], timeout_s: float = 60.0, what: str = "condition") -> T:
    """Poll ``check()`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
