"""A headless Chromium driven by Selenium, and the page helpers the UI tests use (tests/devtools/test_demo.py).

Chromium and its driver come from Debian's packages (``/usr/bin/chromium``, ``/usr/bin/chromedriver``;
``make setup`` installs them where it runs as root); where they are missing the test is skipped, naming the
command that installs them.

Example::

    with chromium() as driver:
        page = Page(driver, Path("shots"))
        page.open("http://127.0.0.1:3000/asset-groups", "01-asset-graph", "Global asset lineage")
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (1600x1000) under chromedriver; its profile and temp files in a private
    directory removed afterwards. Skips the test, naming the install command, when the browser is not installed."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.skip(
            f"headless browser missing: {missing}; install it with `apt-get install -y chromium chromium-driver` "
            "as root (`make setup` does where it can)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1600,1000")
    # Profile and Chromium's temp files in a short directory (its singleton socket's path must fit a UNIX
    # socket's), removed after the session.
    with tempfile.TemporaryDirectory(prefix="chr-", ignore_cleanup_errors=True) as scratch:
        options.add_argument(f"--user-data-dir={scratch}/profile")
        os.mkdir(f"{scratch}/tmp")
        service = Service(str(CHROMEDRIVER), env={**os.environ, "TMPDIR": f"{scratch}/tmp"})
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()


class Page:
    """The browser on one page: wait for texts, dismiss the newsletter dialog, save a screenshot."""

    def __init__(self, driver: Any, artifacts: Path) -> None:
        self.driver, self.artifacts = driver, artifacts

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return str(self.driver.find_element(By.TAG_NAME, "body").text)

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.artifacts / f"{name}.png"))

    def open(self, url: str, shot: str, *needles: str, timeout_s: float = 60, scroll: bool = False) -> str:
        """Open ``url``, wait until every one of ``needles`` is on the page (scrolling the page's panes
        when ``scroll``: charts render when they come into view), save ``<shot>.png``; the page's text."""
        self.driver.get(url)
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            self.dismiss_dialog()
            text = self.text()
            if all(needle in text for needle in needles):
                time.sleep(1)  # let the last requests paint
                self.dismiss_dialog()
                self.shot(shot)
                return self.text()
            if scroll:
                self.driver.execute_script(
                    "for (const e of document.querySelectorAll('*')) "
                    "{ if (e.scrollHeight > e.clientHeight + 10) e.scrollTop += 400; }"
                )
            time.sleep(0.5)
        self.shot(f"{shot}-timeout")
        missing = [needle for needle in needles if needle not in text]
        raise AssertionError(f"{url}: {missing} not on the page within {timeout_s:g}s; page text:\n{text[-3000:]}")

    def wait_for(self, *needles: str, timeout_s: float = 60) -> str:
        """Wait until every one of ``needles`` is on the current page; its text."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if all(needle in text for needle in needles):
                return text
            if time.monotonic() > deadline:
                missing = [needle for needle in needles if needle not in text]
                raise AssertionError(f"{missing} not on the page within {timeout_s:g}s; page text:\n{text[-3000:]}")
            time.sleep(0.5)

    def dismiss_dialog(self) -> None:
        """Skip Dagster's "join the community" dialog if it is up (it comes some time after a page opens)."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.common.by import By

        for skip in self.driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
            try:
                skip.click()
                time.sleep(0.5)
            except WebDriverException:
                pass

    def follow_link(self, href: str, shot: str, *needles: str, timeout_s: float = 90) -> str:
        """Click the link to ``href`` on the page (Dagster opens metadata links in a new tab: switch to it),
        wait for ``needles`` there, save ``<shot>.png``; the page's text."""
        from selenium.webdriver.common.by import By

        before = set(self.driver.window_handles)
        self.dismiss_dialog()
        self.driver.find_element(By.XPATH, f"//a[@href='{href}']").click()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            opened = set(self.driver.window_handles) - before
            if opened:
                self.driver.switch_to.window(opened.pop())
            if self.driver.current_url.startswith(href.split("#")[0]):
                text = self.text()
                if all(needle in text for needle in needles):
                    time.sleep(1)
                    self.shot(shot)
                    return self.text()
            time.sleep(0.5)
        self.shot(f"{shot}-timeout")
        raise AssertionError(f"the link to {href} did not lead to a page with {needles} within {timeout_s:g}s")

    def back_to_first_tab(self) -> None:
        self.driver.switch_to.window(self.driver.window_handles[0])

    def click_button(self, label: str, timeout_s: float = 20) -> None:
        """Click the button whose text contains ``label`` (once no dialog covers it)."""
        from selenium.common.exceptions import ElementClickInterceptedException
        from selenium.webdriver.common.by import By

        deadline = time.monotonic() + timeout_s
        while True:
            self.dismiss_dialog()
            try:
                self.driver.find_element(By.XPATH, f"//button[contains(normalize-space(), '{label}')]").click()
                return
            except ElementClickInterceptedException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def dialog_input(self) -> Any:
        """The text box of the open dialog (the page behind it may have one too)."""
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.XPATH, "//div[contains(@class, 'bp5-dialog')]//input[@type='text']")
