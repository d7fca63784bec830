"""The web page at / (serve/http/web_page.py, serve/static/) in real browsers, Debian's Chromium and Firefox, against the
real server over the mock engine: it loads with no console errors, an answer streams in, stop
cancels the request on the server, regenerate and the stored conversation, reasoning folded, the
live view shows a long read parked while the page's own short question runs (its screenshot is the
README's), an API key asked for and sent, a phone-width window and the keyboard; in Firefox, the chat, the live
view and a phone's width."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.harness import ServerProcess, mock_engine_cmd
from tests.serve.browser import chromium, console_errors, wait_until
from tests.serve.firefox import Firefox
from tests.serve.helpers import make_thinking_model, metrics, scripted_engine_cmd

SLOW = ("--chunk-s", "0.05", "--token-s", "0.03")  # 64-token chunks at 20/s, tokens at 33/s: visible in flight

ANSWERS_JS = ("[...document.querySelectorAll('#messages .msg.assistant')].map(m => ({content: "
              "m.querySelector('.content').textContent, finish: m.dataset.finish, stats: m.querySelector('.stats').textContent}))")


def answers(driver) -> list[dict]:
    return driver.execute_script("return " + ANSWERS_JS)


def open_page(driver, server: ServerProcess) -> None:
    driver.get(server.url + "/")
    wait_until(lambda: driver.find_element(By.ID, "link").text == "live", what="the live view's stream")


def set_field(driver, element_id: str, value: str) -> None:
    """Types into one of the chat's settings (they are folded under 'Settings')."""
    settings = driver.find_element(By.CSS_SELECTOR, "details.settings")
    if not settings.get_attribute("open"):
        settings.find_element(By.TAG_NAME, "summary").click()
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(value, Keys.TAB)  # leaving the field commits it (its change event)


def ask(driver, text: str) -> None:
    prompt = driver.find_element(By.ID, "prompt")
    prompt.send_keys(text)
    prompt.send_keys(Keys.ENTER)


def cancelled(server: ServerProcess) -> float:
    return metrics(server.url).get("strata_requests_total{finish_reason=cancelled}", 0)


def test_chat_streams_stops_regenerates_and_keeps_the_conversation():
    with ServerProcess(engine_cmd=mock_engine_cmd(*SLOW)) as server, chromium() as driver:
        open_page(driver, server)
        model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        assert driver.find_element(By.ID, "model").text == model
        ask(driver, "Hello there, how are you today?")  # the mock engine echoes the prompt: 20 tokens here
        lengths = set()
        # the end: its finish, then the stream's usage chunk (after the finish_reason's) fills in the stats
        wait_until(lambda: lengths.add(len((answers(driver) or [{}])[0].get("content", ""))) or
                   answers(driver)[0]["finish"] == "stop" and "tokens" in answers(driver)[0]["stats"],
                   what="the answer's end")
        assert len(lengths - {0}) >= 3  # it grew while streaming, not all at once
        first = answers(driver)[0]
        assert "20 tokens" in first["stats"] and "tok/s" in first["stats"]
        expected = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "Hello there, how are you today?"}]})
        assert first["content"] == expected.json()["choices"][0]["message"]["content"]  # the API's own answer

        driver.find_element(By.CSS_SELECTOR, "#messages .msg.assistant button.regenerate").click()
        wait_until(lambda: len(answers(driver)) == 1 and answers(driver)[0]["finish"] == "stop",
                   what="the regenerated answer")
        assert answers(driver)[0]["content"] == first["content"]  # the mock answers alike: replaced, not added
        driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": server.url, "permissions": [
            "clipboardReadWrite", "clipboardSanitizedWrite"]})
        driver.find_element(By.CSS_SELECTOR, "#messages .msg.assistant button.copy").click()
        # read in one script at each look: the answer's view may be drawn anew between finding the button and
        # reading it (a stale element otherwise)
        copy_label = "return document.querySelector('#messages .msg.assistant button.copy').textContent"
        wait_until(lambda: driver.execute_script(copy_label) == "Copied", what="the copy")
        assert driver.execute_script("return await navigator.clipboard.readText()") == first["content"]

        # a long system prompt: the echo runs for seconds, and shows that the setting was sent
        set_field(driver, "system", "Count with me: " + " ".join(["one two three four five"] * 40))
        set_field(driver, "max-tokens", "2000")
        ask(driver, "Now a long one please")
        wait_until(lambda: len(answers(driver)) == 2 and len(answers(driver)[1]["content"]) > 30, what="streaming")
        assert answers(driver)[1]["content"].startswith("system\nCount with me: one two")
        assert cancelled(server) == 0
        driver.find_element(By.ID, "stop").click()
        wait_until(lambda: answers(driver)[1]["finish"] == "stopped", what="the stopped answer")
        wait_until(lambda: cancelled(server) == 1, what="the server's cancel")  # the request ended on the server
        assert driver.find_element(By.ID, "send").is_displayed()

        driver.refresh()  # the conversation and the settings are kept in the browser
        wait_until(lambda: len(answers(driver)) == 2, what="the stored conversation")
        assert answers(driver)[0]["content"] == first["content"]
        assert driver.find_element(By.ID, "max-tokens").get_attribute("value") == "2000"
        driver.find_element(By.CSS_SELECTOR, "details.settings summary").click()
        driver.find_element(By.ID, "new-chat").click()
        assert answers(driver) == []
        assert console_errors(driver) == []


def test_the_live_view_shows_a_long_read_parked_while_the_pages_question_runs(tmp_path):
    with ServerProcess(engine_cmd=mock_engine_cmd(*SLOW)) as server, chromium(1280, 760) as driver:
        open_page(driver, server)
        long = threading.Thread(target=httpx.post, args=(f"{server.url}/v1/chat/completions",), kwargs=dict(
            timeout=60, json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "read " * 3000}]}))
        long.start()  # about 47 chunks: 2.4 s of reading
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#request-rows tr[data-state=reading]"),
                   what="the long read in the table")
        ask(driver, "A short question while the long read runs")  # echoed: about 25 tokens, 0.8 s
        both = "return ['parked', 'decoding'].every(s => document.querySelector(`#request-rows tr[data-state=${s}]`))"
        wait_until(lambda: driver.execute_script(both), what="a parked read beside the decoding question")
        # its progress bar, read in one call: the table is drawn again as the state streams in
        value, most = driver.execute_script("const bar = document.querySelector('#request-rows tr[data-state=parked] "
                                            "progress'); return [bar.getAttribute('value'), bar.getAttribute('max')]")
        assert 0 < float(value) < float(most)
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline path.mark.park"), what="the park mark")
        shot = tmp_path / "page.png"
        driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("STRATA_SCREENSHOT"):  # `make screenshot`: the README's picture
            shutil.copy(shot, os.environ["STRATA_SCREENSHOT"])
        long.join()
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline path.mark.resume"), what="the resume mark")
        wait_until(lambda: driver.find_element(By.ID, "stat-parks").text == "1 / 1", what="the totals")
        assert answers(driver)[0]["finish"] == "stop"
        for state in ("reading", "parked", "decoding"):
            assert driver.find_elements(By.CSS_SELECTOR, f"#timeline rect.span.{state}")
        assert console_errors(driver) == []


def test_the_live_view_shows_a_request_waiting_for_memory():
    """A pool of 384 tokens: a 300-token request decoding holds most of it, and a second one (another
    prompt) pauses for its blocks until the first is done."""
    engine = mock_engine_cmd("--chunk", "16", "--chunk-s", "0.02", "--token-s", "0.03", "--max-running", "2",
                             "--kv-tokens", "384")
    with ServerProcess(engine_cmd=engine) as server, chromium() as driver:
        open_page(driver, server)
        badge = driver.find_element(By.ID, "memory-wait")
        assert not badge.is_displayed()

        def read(first: int, max_tokens: int):
            return threading.Thread(target=httpx.post, args=(f"{server.url}/v1/completions",), kwargs=dict(
                timeout=60, json={"model": "m", "max_tokens": max_tokens, "prompt": list(range(first, first + 300))}))

        a, b = read(100, 60), read(1000, 2)  # A: 1.8 s of decoding
        a.start()
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#request-rows tr[data-state=decoding]"), what="A")
        b.start()
        wait_until(badge.is_displayed, what="the memory badge")
        assert driver.find_elements(By.CSS_SELECTOR, "#request-rows tr[data-state=paused]")
        assert driver.find_elements(By.CSS_SELECTOR, "#timeline rect.span.paused")
        a.join()
        b.join()
        wait_until(lambda: not badge.is_displayed(), what="the badge gone")
        assert console_errors(driver) == []


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> Path:
    return make_thinking_model(tmp_path_factory.mktemp("thinking"))


def test_reasoning_is_shown_folded(thinking_model):
    output = "<think>\nThe user greets me; answer briefly.\n</think>\n\nHello there!"
    with (ServerProcess(engine_cmd=scripted_engine_cmd(thinking_model, output), extra=["--model", str(thinking_model)])
          as server, chromium() as driver):
        open_page(driver, server)
        ask(driver, "Hi")
        wait_until(lambda: answers(driver) and answers(driver)[0]["finish"] == "stop", what="the answer")
        message = driver.find_element(By.CSS_SELECTOR, "#messages .msg.assistant")
        assert message.find_element(By.CLASS_NAME, "content").text == "Hello there!"
        reasoning = message.find_element(By.CSS_SELECTOR, "details.reasoning")
        assert reasoning.is_displayed() and not reasoning.get_attribute("open")  # folded
        reasoning.find_element(By.TAG_NAME, "summary").click()
        assert reasoning.find_element(By.CLASS_NAME, "reasoning-text").text == "The user greets me; answer briefly."
        assert console_errors(driver) == []


def test_with_an_api_key_the_page_asks_for_it_and_sends_it():
    with ServerProcess(engine_cmd=mock_engine_cmd(), api_key="sesame") as server, chromium() as driver:
        driver.get(server.url + "/")
        dialog = driver.find_element(By.ID, "key-dialog")
        wait_until(dialog.is_displayed, what="the key dialog")
        assert driver.find_element(By.ID, "link").text == "API key needed"
        driver.find_element(By.ID, "key-input").send_keys("wrong", Keys.ENTER)
        wait_until(lambda: driver.find_element(By.ID, "key-error").is_displayed(), what="the refusal")
        key = driver.find_element(By.ID, "key-input")
        key.clear()
        key.send_keys("sesame", Keys.ENTER)
        wait_until(lambda: driver.find_element(By.ID, "link").text == "live", what="the events with the key")
        assert not dialog.is_displayed()
        ask(driver, "Hello with a key")
        wait_until(lambda: answers(driver) and answers(driver)[0]["finish"] in ("stop", "length"), what="the answer")
        assert answers(driver)[0]["content"]
        errors = console_errors(driver)  # the refused loads, and nothing else
        assert errors and all("401" in e for e in errors), errors


def test_a_phone_width_window_and_the_keyboard_alone():
    with ServerProcess(engine_cmd=mock_engine_cmd("--token-s", "0.2")) as server, chromium(390, 844) as driver:
        open_page(driver, server)
        width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1]  # nothing wider than the screen
        chat, live = driver.find_element(By.ID, "chat"), driver.find_element(By.ID, "live")
        assert chat.is_displayed() and not live.is_displayed()  # one view at a time, tabs to switch

        # the keyboard alone: the prompt has the focus, Enter sends, Escape stops
        active = driver.switch_to.active_element
        assert active.get_attribute("id") == "prompt"
        active.send_keys("Typed, never clicked", Keys.ENTER)
        wait_until(lambda: answers(driver) and len(answers(driver)[0]["content"]) > 5, what="streaming")
        driver.switch_to.active_element.send_keys(Keys.ESCAPE)
        wait_until(lambda: answers(driver)[0]["finish"] == "stopped", what="Escape's stop")
        wait_until(lambda: cancelled(server) == 1, what="the server's cancel")
        active = driver.switch_to.active_element
        assert active.get_attribute("id") == "prompt"  # the focus is back for the next message
        for _ in range(10):  # backwards past the answer's buttons and the settings to the view tabs
            active = driver.switch_to.active_element
            if active.get_attribute("id") == "tab-live":
                break
            active.send_keys(Keys.SHIFT, Keys.TAB)
        else:
            raise AssertionError("the Live tab is not reachable with Tab")
        active.send_keys(Keys.ENTER)
        assert live.is_displayed() and not chat.is_displayed()
        assert driver.find_element(By.ID, "tab-live").get_attribute("aria-selected") == "true"
        driver.find_element(By.ID, "tab-chat").click()  # and by touch
        assert chat.is_displayed() and not live.is_displayed()
        assert console_errors(driver) == []


def test_in_firefox_the_chat_streams_and_the_live_view_shows_the_parked_read():
    with ServerProcess(engine_cmd=mock_engine_cmd(*SLOW)) as server, Firefox() as firefox:
        firefox.get(server.url + "/")
        wait_until(lambda: firefox.run("document.getElementById('link').textContent") == "live", what="the stream")
        assert firefox.run("document.activeElement.id") == "prompt"
        firefox.type("Hello from Firefox", "ENTER")
        lengths = set()
        wait_until(lambda: lengths.add(len((firefox.run(ANSWERS_JS) or [{}])[0].get("content", ""))) or
                   firefox.run(ANSWERS_JS)[0]["finish"] == "stop" and "tokens" in firefox.run(ANSWERS_JS)[0]["stats"],
                   what="the answer's end (and its stats, filled by the usage chunk after the finish)")
        assert len(lengths - {0}) >= 3 and "20 tokens" in firefox.run(ANSWERS_JS)[0]["stats"]

        long = threading.Thread(target=httpx.post, args=(f"{server.url}/v1/chat/completions",), kwargs=dict(
            timeout=60, json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "read " * 3000}]}))
        long.start()
        wait_until(lambda: firefox.run("!!document.querySelector('#request-rows tr[data-state=reading]')"),
                   what="the long read in the table")
        firefox.type("A short question", "ENTER")
        both = "['parked', 'decoding'].every(s => document.querySelector(`#request-rows tr[data-state=${s}]`))"
        wait_until(lambda: firefox.run(both), what="a parked read beside the decoding question")
        long.join()
        wait_until(lambda: firefox.run("document.getElementById('stat-parks').textContent") == "1 / 1",
                   what="the totals")
        assert firefox.run("document.querySelectorAll('#timeline path.mark').length") >= 2  # a park and a resume

        firefox.viewport(390, 844)  # a phone's width: one view at a time, nothing wider than the screen
        assert firefox.run("document.documentElement.scrollWidth <= window.innerWidth")
        assert firefox.run("getComputedStyle(document.getElementById('live')).display") == "none"
        assert firefox.console_errors() == []
