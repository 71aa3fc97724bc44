"""Headless Chromium (Debian's chromium + chromium-driver) driven by Selenium, for the console's tests."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# the launch flags keep Chromium from calling home (updates, sync, safe browsing lists, QUIC probes):
# the test then checks that the only host it talked to was the test server
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(DRIVER)


# skipped on a machine without them, except where MUSTER_REQUIRE_BROWSER=1 (.ci/run): there it fails
needs_chromium = pytest.mark.skipif(not available() and os.environ.get("MUSTER_REQUIRE_BROWSER") != "1",
                                    reason="needs chromium and chromium-driver (.ci/run installs them)")


def screenshot_dir() -> Path:
    """Where screenshots go: MUSTER_SCREENSHOT_DIR, else a new temporary directory (printed)."""
    chosen = os.environ.get("MUSTER_SCREENSHOT_DIR")
    path = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="muster-screenshots-"))
    path.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots in {path}")
    return path


def start(width: int = 1280, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="muster-chromium-")
    for flag in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.muster_profile = profile
    return driver


def stop(driver) -> None:
    try:
        driver.quit()
    finally:
        shutil.rmtree(driver.muster_profile, ignore_errors=True)


def hosts_requested(driver) -> set[str]:
    """Every host a page of this browser sent a request to since the last call (Chrome's network log)."""
    hosts = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            url = urlparse(message["params"]["request"]["url"])
            if url.scheme in ("http", "https", "ws", "wss"):
                hosts.add(url.netloc)
    return hosts


def csp_violations(driver) -> list[str]:
    """What the page's console said about Content-Security-Policy since the last call."""
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
