#!/usr/bin/env python3
"""The chat page of `ds41 serve` (GET /) in a real browser: Debian's chromium, headless, driven
through chromium-driver by Selenium. Send a message and see the answer stream in; stop a long
answer; attach an image and get an answer about it; the page loads nothing from elsewhere.

Usage: chat_page_test.py DS41_BINARY SHARED_DIR
Exit 77 (CTest: skipped) when selenium, chromium or chromium-driver is missing.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib

from server_process import start_server


def png(width, height):
    """A small RGB PNG (a gradient), written by hand."""
    rows = b"".join(b"\0" + b"".join(bytes((x * 7 % 256, y * 5 % 256, (x + y) % 256)) for x in range(width))
                    for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def main():
    ds41, shared = os.path.abspath(sys.argv[1]), os.environ.get("DS41_SHARED_DIR", sys.argv[2])
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        print("SKIP: selenium is not installed (pip install selenium)")
        return 77
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    tokenizer = os.path.join(shared, "assets", "deepseek_v3_tokenizer", "tokenizer.json")
    if not chromium or not os.path.exists(driver_bin) or not os.path.exists(tokenizer):
        print("SKIP: chromium, chromium-driver or the shared tokenizer is missing")
        return 77

    tmp = tempfile.mkdtemp(prefix="ds41-page-")
    model = os.path.join(tmp, "tiny")
    subprocess.run([ds41, "mkmodel", "--preset", "tiny", "--out", model, "--quiet", "--threads", "2"], check=True)
    # The V3 tokenizer with the image token at id 129264 (as in V4.1), so the page can send images.
    t = json.load(open(tokenizer))
    nxt = max([a["id"] + 1 for a in t["added_tokens"]] + [len(t["model"]["vocab"])])
    for i in range(nxt, 129265):
        t["added_tokens"].append({"id": i, "content": "<｜deepseek_image｜>" if i == 129264 else "<｜filler_%d｜>" % i,
                                  "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    json.dump(t, open(os.path.join(model, "tokenizer.json"), "w"))
    image = os.path.join(tmp, "picture.png")
    open(image, "wb").write(png(48, 32))

    server, port, log = start_server([ds41, "serve", "-m", model, "--port", "0", "--threads", "2"])
    base = "http://127.0.0.1:%d" % (port or 0)
    browser = None
    try:
        if port is None:
            server.wait()
            print("".join(log))
            return 1
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    time.sleep(0.5)
                    print("".join(log))
                    return 1
                time.sleep(0.1)
        page = urllib.request.urlopen(base + "/").read().decode()
        # Nothing from elsewhere: no absolute or protocol-relative URL to load (its own origin only).
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page loads something from elsewhere"
        assert "http://" not in page and "https://" not in page

        opts = Options()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
            opts.add_argument(a)
        browser = webdriver.Chrome(service=Service(driver_bin), options=opts)
        browser.set_script_timeout(60)
        browser.get(base + "/")

        def wait(cond, what, timeout=60):
            end = time.time() + timeout
            while time.time() < end:
                v = cond()
                if v:
                    return v
                time.sleep(0.05)
            raise AssertionError("timed out waiting for " + what)

        wait(lambda: "tiny" in browser.find_element(By.ID, "model").text, "the model name")

        def last_answer():
            answers = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")
            return answers[-1] if answers else None

        def set_field(id_, value):
            el = browser.find_element(By.ID, id_)
            browser.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'))",
                                   el, value)

        # 1. A message; the answer grows while it streams, then is done.
        set_field("max-tokens", "48")
        browser.find_element(By.ID, "input").send_keys("Hello there")
        browser.find_element(By.ID, "send").click()
        answer = wait(last_answer, "an answer bubble")
        lengths = set()
        end = time.time() + 60
        while answer.get_attribute("data-state") == "streaming" and time.time() < end:
            lengths.add(len(answer.find_element(By.CSS_SELECTOR, ".content").text))
            time.sleep(0.01)
        assert answer.get_attribute("data-state") == "done", answer.get_attribute("data-state")
        text = answer.find_element(By.CSS_SELECTOR, ".content").text
        assert text, "empty answer"
        assert len([n for n in lengths if 0 < n < len(text)]) >= 1, ("not streamed", lengths, len(text))
        user = browser.find_elements(By.CSS_SELECTOR, ".msg.user")[-1].text
        assert user == "Hello there", user

        # 2. A long answer, stopped: the page says so, the server cancels, the page is usable again.
        set_field("max-tokens", "4000")
        browser.find_element(By.ID, "input").send_keys("Tell me a long story")
        browser.find_element(By.ID, "send").click()
        wait(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2 and
             last_answer().find_element(By.CSS_SELECTOR, ".content").text, "the second answer to start")
        browser.find_element(By.ID, "stop").click()
        wait(lambda: last_answer().get_attribute("data-state") == "stopped", "the stop")
        assert browser.find_element(By.ID, "send").is_enabled() and not browser.find_element(By.ID, "stop").is_enabled()

        def cancelled():
            m = urllib.request.urlopen(base + "/metrics").read().decode()
            return any(l.startswith("ds41_requests_cancelled_total") and not l.endswith(" 0") for l in m.splitlines())
        wait(cancelled, "the server to cancel the stopped answer", timeout=20)

        # 3. An image attached through the file input: a thumbnail, then an answer about it.
        set_field("max-tokens", "8")
        browser.find_element(By.ID, "file").send_keys(image)
        wait(lambda: browser.find_elements(By.CSS_SELECTOR, "#attachments img"), "the thumbnail")
        browser.find_element(By.ID, "input").send_keys("What is in the picture?")
        browser.find_element(By.ID, "send").click()
        wait(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 3 and
             last_answer().get_attribute("data-state") in ("done", "error"), "the answer about the image")
        assert last_answer().get_attribute("data-state") == "done", last_answer().text
        assert browser.find_elements(By.CSS_SELECTOR, ".msg.user img"), "the image is not shown in the message"
        assert not browser.find_elements(By.CSS_SELECTOR, "#attachments img"), "attachments not cleared"
        m = urllib.request.urlopen(base + "/metrics").read().decode()
        assert any(l.startswith("ds41_images_total") and not l.endswith(" 0") for l in m.splitlines()), \
            "the server saw no image"
        logs = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        assert not logs, logs
        print("chat page: streamed answer, stop, image upload: all checks passed")
        return 0
    finally:
        if browser:
            browser.quit()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
