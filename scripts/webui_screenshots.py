"""Take docs/webui-chat.png and docs/webui-kv.png: `pagedattn serve` on the embedded SmolLM2,
driven by headless Chromium (Debian's chromium + chromium-driver) through Selenium.

    PYTHONPATH=src python scripts/webui_screenshots.py [OUT_DIR]
"""

from __future__ import annotations

import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from pagedattn.server.app import build_app

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = "You are a concise assistant. Answer in a few sentences; put code in fenced blocks."


def wait(check, timeout_s: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError("the page did not get there")
        time.sleep(0.1)
    return value


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1440,940",
                "--force-device-scale-factor=1", "--hide-scrollbars"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def ask(driver: webdriver.Chrome, text: str) -> None:
    before = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats"))
    driver.find_element(By.ID, "prompt").send_keys(text, Keys.ENTER)
    wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")) > before)


def main(out: Path) -> None:
    app = build_app(None, kv_cache_mib=96)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    wait(lambda: server.started, 60)
    driver = browser()
    try:
        driver.get(url + "/")
        wait(lambda: driver.find_element(By.ID, "model").get_attribute("value") == MODEL)
        driver.find_element(By.ID, "system").send_keys(SYSTEM)
        driver.find_element(By.ID, "temperature").send_keys(Keys.HOME)
        ask(driver, "What is paged attention, in two sentences?")
        driver.find_element(By.ID, "new-chat").click()
        ask(driver, "What is the capital of France?")
        driver.find_element(By.ID, "new-chat").click()
        ask(driver, "Write a Python function that reverses a string. Use a ```python block.")
        ask(driver, "Now make it reverse the words instead of the characters.")
        driver.execute_script("document.getElementById('messages').scrollTop = 0")
        driver.save_screenshot(str(out / "webui-chat.png"))

        def run(i: int) -> None:  # requests sharing a long prefix, then their own tails
            prompt = "You are a helpful storyteller. " * 12 + f"Story number {i}: once upon"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 220 + 40 * i,
                    "ignore_eos": True}
            httpx.post(url + "/v1/completions", json=body, timeout=300)

        driver.set_window_size(1440, 1060)
        driver.get(url + "/kv")
        wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#legend b"))
        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=run, args=(i,)))
            threads[-1].start()
            time.sleep(3)
        time.sleep(3)
        driver.save_screenshot(str(out / "webui-kv.png"))
        for t in threads:
            t.join()
    finally:
        driver.quit()
        server.should_exit = True


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
