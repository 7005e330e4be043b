"""A real headless Chromium (Debian's `chromium` + `chromium-driver`) driving the playground page.

Used by the browser test and by scripts/playground_screenshot.py. Selenium is given the
driver's path, so it never tries to download a browser (CI has no network for that).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "apt-get install chromium chromium-driver (`make test` does it)"


@dataclass(frozen=True)
class Chromium:
    browser: str
    driver: str


def find_chromium() -> Chromium | None:
    """The browser and its driver: $CHROMIUM_BINARY / $CHROMEDRIVER, else the first found on PATH."""
    browser = os.environ.get("CHROMIUM_BINARY") or next(filter(None, map(shutil.which, BROWSER_NAMES)), None)
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    return Chromium(browser, driver) if browser and driver else None


@contextmanager
def headless_chromium(chromium: Chromium, width: int = 1280, height: int = 1000) -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = chromium.browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI containers run as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",  # small /dev/shm in containers
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, for `console_errors`
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromium.driver))
    try:
        yield driver
    finally:
        driver.quit()


class Playground:
    """The page, as a user sees it: what to type, what to click, what to wait for."""

    def __init__(self, driver: WebDriver, url: str, timeout: float = 60.0) -> None:
        self.driver = driver
        self.url = url.rstrip("/")
        self.timeout = timeout

    def wait(self, condition: object, timeout: float | None = None) -> object:
        return WebDriverWait(self.driver, timeout or self.timeout, poll_frequency=0.1).until(condition)

    def by_id(self, element_id: str) -> WebElement:
        return self.driver.find_element(By.ID, element_id)

    def loaded(self) -> bool:
        """Whether the page has read /info (the header then names model and artifact)."""
        return "·" in self.by_id("model-line").text

    def open(self, api_key: str | None = None) -> None:
        """Load the page and wait until it has read /info, typing `api_key` in if the page asks for one."""
        self.driver.get(f"{self.url}/")
        if api_key is not None:
            self.wait(lambda d: self.loaded() or self.by_id("key-form").is_displayed())
            if not self.loaded():
                self.by_id("api-key").send_keys(api_key)
                self.by_id("key-form").submit()
        self.wait(lambda d: self.loaded())

    def fill(self, element_id: str, text: str) -> None:
        field = self.by_id(element_id)
        field.clear()
        field.send_keys(text)

    def ask(self, question: str, max_new_tokens: int | None = None) -> None:
        self.fill("question", question)
        if max_new_tokens is not None:
            self.fill("max-new-tokens", str(max_new_tokens))
        self.by_id("generate").click()

    def score(self, question: str, answer: str) -> None:
        self.by_id("tab-score").click()
        self.fill("score-prompt", question)
        self.fill("score-answer", answer)
        self.by_id("score").click()

    def wait_for_verdict(self) -> WebElement:
        """The badge once the answer is complete (a decision is shown), and the button usable again."""
        verdict = self.by_id("verdict")
        self.wait(lambda d: {"accepted", "rejected"} & set(verdict.get_attribute("class").split()))
        self.wait(lambda d: self.by_id("generate").is_enabled())
        return verdict

    def wait_for_message(self) -> str:
        box = self.by_id("message")
        self.wait(lambda d: box.is_displayed() and box.text)
        return box.text

    def tokens(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")

    def least_confident(self) -> WebElement | None:
        """The token lowest on the shading scale (None if no token has a value)."""
        scored = [(float(p), t) for t in self.tokens() if (p := t.get_attribute("data-position"))]
        return min(scored, key=lambda pair: pair[0])[1] if scored else None

    def tooltip(self) -> WebElement:
        return self.by_id("token-tip")

    def focus(self, token: WebElement) -> str:
        """Focus a token (as Tab would) and return its tooltip's text once shown."""
        self.driver.execute_script("arguments[0].focus()", token)
        tip = self.tooltip()
        self.wait(lambda d: tip.is_displayed() and tip.text, timeout=10)
        return tip.text

    def console_errors(self) -> list[str]:
        """Errors the page logged since the last call (script errors, failed loads, CSP refusals)."""
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def screenshot(self, path: Path, focus: WebElement | None = None, height: int | None = None) -> Path:
        """The whole page (the window grows to the document's height first), or its top `height` pixels,
        `focus`'s tooltip open."""
        width = self.driver.get_window_size()["width"]
        if height is None:
            height = int(self.driver.execute_script("return document.documentElement.scrollHeight")) + 40
        self.driver.set_window_size(width, min(max(height, 600), 6000))
        if focus is not None:  # resizing closes the tooltip: open it again where the token now is
            self.driver.execute_script("arguments[0].blur()", focus)
            self.focus(focus)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not self.driver.save_screenshot(str(path)):
            raise RuntimeError(f"could not write the screenshot {path}")
        return path
