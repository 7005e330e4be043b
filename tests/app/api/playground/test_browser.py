"""The playground in a real headless Chromium against a live server on the tiny model and artifact.

Needs Debian's `chromium` and `chromium-driver`: without them this fails in CI (CI=true) and
is skipped elsewhere. Screenshots go to the test's tmp dir; their paths are printed (`-s`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from tests.app.live_server import live_server

pytest.importorskip("selenium", reason="selenium is in the test extra: pip install -e '.[test]'")

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from tests.app.api.playground.browser import INSTALL_HINT, Playground, find_chromium, headless_chromium

QUESTION = "what is the capital of france ?"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium = find_chromium()
    if chromium is None:
        message = f"headless Chromium not found: {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with headless_chromium(chromium) as driver:
        yield driver


@pytest.fixture(scope="module")
def service_url(service_settings: Settings, artifact_with_report: Path) -> Iterator[str]:
    with live_server(service_settings.model_copy(update={"artifact_dir": artifact_with_report})) as url:
        yield url


@pytest.fixture
def page(browser: WebDriver, service_url: str) -> Playground:
    browser.set_window_size(1280, 1000)
    playground = Playground(browser, service_url)
    playground.console_errors()  # drop what earlier tests' pages logged
    playground.open()
    return playground


def _long_question(url: str, tokens: int) -> str:
    """A question the (random) tiny model answers with `tokens` tokens before any stop token."""
    for word in ("france", "river", "king", "ocean", "planet", "city", "queen", "moon", "island", "star"):
        question = f"what is the biggest {word} ?"
        request = {"messages": [{"role": "user", "content": question}], "max_new_tokens": tokens}
        if httpx.post(f"{url}/v1/generate", json=request, timeout=60).json()["finish_reason"] == "length":
            return question
    raise AssertionError(f"no test question runs to {tokens} tokens")


def test_an_answer_that_ended_on_its_end_token_counts_the_tokens_shown(page: Playground, service_url: str) -> None:
    """Usage counts the end token too; the notice beside the answer counts what it shows."""
    request = {"messages": [{"role": "user", "content": QUESTION}], "max_new_tokens": 24, "temperature": 2.0}
    for seed in range(64):
        body = httpx.post(f"{service_url}/v1/generate", json={**request, "seed": seed}, timeout=60).json()
        if body["finish_reason"] == "stop":
            break
    else:
        raise AssertionError("no seed ended on the end token: raise the temperature")
    page.fill("temperature", "2")
    page.fill("seed", str(seed))
    page.ask(QUESTION, max_new_tokens=24)
    page.wait_for_verdict()
    assert len(page.tokens()) == len(body["tokens"]) == body["usage"]["completion_tokens"] - 1
    assert page.by_id("finish").text.startswith(f"Finished ({len(body['tokens'])} tokens).")


def test_ask_streams_shaded_tokens_with_tooltips_and_a_verdict(page: Playground, tmp_path: Path) -> None:
    page.ask(QUESTION, max_new_tokens=8)
    verdict = page.wait_for_verdict()
    assert ("Accepted" in verdict.text) != ("Rejected" in verdict.text)
    assert "threshold" in verdict.text and "calibrated" in verdict.text
    tokens = page.tokens()
    finish = page.by_id("finish").text
    assert tokens and f"({len(tokens)} tokens)" in finish, finish
    # One tab stop for the answer, which moves with the focus (a roving tabindex).
    assert [t.get_attribute("tabindex") for t in tokens] == ["0"] + ["-1"] * (len(tokens) - 1)
    for token in tokens:
        shade = token.value_of_css_property("background-color")
        assert shade and shade not in ("rgba(0, 0, 0, 0)", "transparent"), shade
        assert token.get_attribute("aria-describedby") == "token-tip"
        text = page.focus(token)
        assert [t.get_attribute("tabindex") for t in tokens].count("0") == 1 and token.get_attribute("tabindex") == "0"
        assert "probability" in text and "entropy" in text and "TAD confidence" in text
        assert "Top alternatives" in text and "Attention to the previous tokens" in text
    # Keyboard: arrows walk the tokens, Escape closes the tooltip.
    page.focus(tokens[0])
    tokens[0].send_keys(Keys.ARROW_RIGHT)
    assert page.driver.switch_to.active_element == tokens[1]
    tokens[1].send_keys(Keys.ESCAPE)
    assert not page.tooltip().is_displayed()
    # The attention strip of a later token shows its N lags (the tiny artifact reads 4).
    page.focus(tokens[-1])
    assert len(page.tooltip().find_elements(By.CSS_SELECTOR, ".strip .cell")) == 4
    print(f"\nplayground screenshot: {page.screenshot(tmp_path / 'playground.png', focus=tokens[-1])}")
    assert page.console_errors() == []  # no script error, failed load or CSP refusal


def test_switching_the_measure_reshades_the_tokens(page: Playground) -> None:
    page.ask(QUESTION, max_new_tokens=6)
    page.wait_for_verdict()
    before = [t.value_of_css_property("background-color") for t in page.tokens()]
    page.driver.find_element(By.CSS_SELECTOR, "input[name='measure'][value='entropy']").click()
    after = [t.value_of_css_property("background-color") for t in page.tokens()]
    assert before != after and "entropy" in page.by_id("legend").text


def test_a_422_is_a_readable_message_naming_the_field(page: Playground) -> None:
    page.ask(QUESTION, max_new_tokens=100_000)
    message = page.wait_for_message()
    assert "Invalid input" in message and "max_new_tokens" in message and "between 1 and 32" in message
    assert page.by_id("max-new-tokens").get_attribute("aria-invalid") == "true"
    assert "No verdict" in page.by_id("verdict").text
    # The page still works afterwards.
    page.ask(QUESTION, max_new_tokens=3)
    page.wait_for_verdict()
    assert not page.by_id("message").is_displayed()


def test_early_stop_is_shown_as_it_happens(page: Playground, service_url: str) -> None:
    question = _long_question(service_url, 20)
    page.driver.find_element(By.ID, "early-stop").click()
    page.by_id("policy-target").send_keys("fixed")  # choose the "fixed threshold…" option
    page.fill("policy-threshold", "0")
    page.ask(question, max_new_tokens=20)
    verdict = page.wait_for_verdict()
    assert "Rejected" in verdict.text and "fixed" in verdict.text
    finish = page.by_id("finish").text
    assert "Stopped early" in finish and "crossed the threshold" in finish
    assert len(page.tokens()) < 20


def test_score_your_own_answer(page: Playground) -> None:
    page.score(QUESTION, "paris is the capital")
    verdict = page.wait_for_verdict()
    assert "Accepted" in verdict.text or "Rejected" in verdict.text
    assert "teacher-forced" in page.by_id("finish").text
    assert page.tokens() and "probability" in page.focus(page.tokens()[-1])


def test_calibration_view_and_report_figures(page: Playground) -> None:
    chart = page.driver.find_element(By.CSS_SELECTOR, "#calibration svg.calibration-chart")
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.point")) >= 2
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.point.active")) == 1
    rows = page.driver.find_elements(By.CSS_SELECTOR, "#calibration tr[aria-current='true']")
    assert len(rows) == 1 and "active" in rows[0].text
    page.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#report img")) == 2)
    for image in page.driver.find_elements(By.CSS_SELECTOR, "#report img"):
        page.wait(lambda d, image=image: d.execute_script("return arguments[0].naturalWidth", image) == 1)
        assert image.get_attribute("src").startswith("blob:")
    assert page.console_errors() == []


def test_the_page_asks_for_the_api_key_and_sends_it_as_a_header(
    browser: WebDriver, service_settings: Settings, artifact_with_report: Path
) -> None:
    settings = Settings(**{**service_settings.model_dump(), "artifact_dir": artifact_with_report, "api_key": "s3cret"})
    with live_server(settings) as url:
        page = Playground(browser, url)
        page.driver.get(f"{url}/")
        assert "API key" in page.wait_for_message()
        # A key fetch could not send as a header is refused in the form, not taken for an unreachable service.
        page.by_id("api-key").send_keys("s3crét")
        page.by_id("key-form").submit()
        page.wait(lambda d: "cannot be sent" in page.by_id("message").text)
        assert page.by_id("key-form").is_displayed()
        page.by_id("api-key").clear()
        page.open(api_key="s3cret")
        page.ask(QUESTION, max_new_tokens=3)
        page.wait_for_verdict()
        page.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#report img")) == 2)
        fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert fetched and not any("s3cret" in name for name in fetched)
        assert browser.execute_script("return sessionStorage.length") == 0  # "remember" was not ticked


def test_a_calibration_only_artifact_is_named_with_tad_off_and_why(
    browser: WebDriver, service_settings: Settings, tiny_calibration_artifact: Path
) -> None:
    settings = service_settings.model_copy(update={"artifact_dir": tiny_calibration_artifact})
    with live_server(settings) as url:
        page = Playground(browser, url)
        page.console_errors()  # drop what earlier tests' pages logged
        page.open()
        header = page.by_id("model-line").text
        reason = httpx.get(f"{url}/info", timeout=30).json()["tad_unavailable_reason"]
        assert reason and f"artifact {tiny_calibration_artifact.name}, TAD off ({reason})" in header, header
        assert "null" not in header
        page.ask(QUESTION, max_new_tokens=3)
        assert {"Accepted", "Rejected"} & set(page.wait_for_verdict().text.split())
        assert page.console_errors() == []
