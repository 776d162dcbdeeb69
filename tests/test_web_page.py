"""The chat page at / in a real headless browser (Debian's chromium and chromedriver, driven by
selenium): load it, send messages, watch the streamed answer and its colours. The test writes
a screenshot for humans ($FLY_CPP_ARTIFACTS, default build/artifacts/web-chat.png). It skips
where no browser is installed (.ci/run installs one)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from serving import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("FLY_CPP_ARTIFACTS", Path(__file__).resolve().parents[1] / "build" / "artifacts"))
KEY = "page-key"

pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="no headless browser: apt-get install chromium chromium-driver")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # window 2 and a low gate make loose accepts frequent on the tiny story model, so all three
    # colours show up in one answer
    s = Server(tmp_path_factory.mktemp("page"), "-t", "1", "-c", "1024", "--api-key", KEY,
               "--window", "2", "--entropy-threshold", "0.1")
    yield s
    assert s.stop() == 0, s.stderr()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[test])")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not look for drivers on the network
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def wait(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ask(browser, text: str):
    """Send a message from the page; the finished assistant bubble."""
    from selenium.webdriver.common.by import By

    before = len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
    box = browser.find_element(By.ID, "message")
    box.send_keys(text)
    browser.find_element(By.ID, "send").click()
    answers = wait(lambda: (a := browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) and len(a) > before and a,
                   "an answer bubble")
    answer = answers[-1]
    wait(lambda: answer.get_attribute("data-state") == "done", "the answer to finish")
    return answer


def test_page_is_served_without_the_key_and_offline(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "https://" not in page.text and "http://" not in page.text  # nothing fetched from elsewhere
    for name in ("chat.js", "chat.css"):
        r = httpx.get(f"{server.url}/static/{name}")
        assert r.status_code == 200 and "https://" not in r.text and "http://" not in r.text
    assert httpx.get(server.url + "/static/..%2Fapp.py").status_code == 404
    assert httpx.get(server.url + "/props").status_code == 401  # the API itself still wants the key


def test_chat_in_a_browser(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server.url + "/")
    wait(lambda: browser.find_element(By.ID, "status").text == "ready", "the page to see the server ready")

    # without the key the server refuses, and the page says so
    answer = ask(browser, "Hello")
    assert "API key" in answer.find_element(By.CSS_SELECTOR, ".error").text

    key = browser.find_element(By.ID, "api_key")
    key.send_keys(KEY)
    browser.find_element(By.ID, "system").send_keys("You tell short stories.")
    Select(browser.find_element(By.ID, "mode")).select_by_value("fly")
    browser.find_element(By.ID, "k").send_keys("8")
    browser.find_element(By.ID, "max_tokens").send_keys("80")
    wait(lambda: "stories260K" in browser.find_element(By.ID, "model").text, "the model name", timeout=30)

    first = ask(browser, "Tell me a story about a cat.")
    second = ask(browser, "And then what happened to the dog?")  # a second turn of the same chat
    for answer in (first, second):
        spans = answer.find_elements(By.CSS_SELECTOR, ".answer .tok")
        assert spans and "".join(s.text for s in spans).strip()
        stats = answer.find_element(By.CSS_SELECTOR, ".stats").text
        assert "tok/s" in stats and "mean accepted" in stats and "loose" in stats
    classes = {c for s in first.find_elements(By.CSS_SELECTOR, ".answer .tok") + second.find_elements(
        By.CSS_SELECTOR, ".answer .tok") for c in s.get_attribute("class").split()}
    assert {"tok-drafted", "tok-loose"} <= classes  # drafted and loosely accepted tokens are coloured
    drafted = first.find_element(By.CSS_SELECTOR, ".tok-drafted")
    loose = browser.find_elements(By.CSS_SELECTOR, ".answer .tok-loose")[0]
    assert drafted.value_of_css_property("color") != loose.value_of_css_property("color") or \
        loose.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.user")) == 3
    # Regenerate: the last answer written again in its place, the conversation no longer
    regen = browser.find_element(By.ID, "regen")
    assert regen.is_displayed()
    regen.click()
    wait(lambda: (a := browser.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
         and a[-1].get_attribute("data-state") == "done" and a[-1].find_elements(By.CSS_SELECTOR, ".stats"),
         "the regenerated answer")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.user")) == 3
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 3
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "web-chat.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
