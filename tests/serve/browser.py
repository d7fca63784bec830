"""Debian's Chromium, headless, driven by Selenium through Debian's chromedriver (the Makefile's
`browser` target installs both), for the web page's tests."""
from __future__ import annotations

import contextlib
import shutil
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# this machine's network is closed: Chromium's own background connections only make noise
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--mute-audio")


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 860):
    """A fresh browser (its own empty profile), quit on leaving however the test ends."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """The console's errors since the last call (the page's own and failed loads)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition"):
    """Polls predicate() until it returns something true (returned), else fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout_s:g} s")
        time.sleep(0.05)
