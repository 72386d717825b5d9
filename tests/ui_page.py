#!/usr/bin/env python3
"""The page of `tpgen serve` (GET /) in headless Chromium, driven by selenium,
for tests/sh/ui.sh. Prints "ok - NAME" / "FAIL - NAME: why" lines.

  ui_page.py render PORT SCREENSHOT [API_KEY]
      loads /, fills the form (prompt, size, steps, seed, guidance) and starts
      it from the keyboard (Ctrl+Enter in the prompt); at least one partial
      image must appear in #preview, and #result must be the PNG the API
      gives for the same request, byte for byte; the session list grows; no
      errors in the browser console; at a phone's width nothing scrolls
      sideways. With API_KEY: the page loads without it, a render without it
      is refused (401 shown in #status), with it typed into #api-key it works.
  ui_page.py edit PORT IMAGE
      a reference image through #images: #result is the API's edit
"""
import base64
import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait


def ok(name):
    print(f"ok - {name}", flush=True)


def fail(name, why):
    print(f"FAIL - {name}: {why}", flush=True)


def browser():
    o = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1000"):
        o.add_argument(a)
    o.binary_location = "/usr/bin/chromium"
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def api_png(port, body, key=None):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/images/generations", data=json.dumps(body).encode(),
                                 headers=h, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return base64.b64decode(json.loads(r.read())["data"][0]["b64_json"])


def fill(d, **fields):
    for k, v in fields.items():
        e = d.find_element(By.ID, k)
        e.clear()
        e.send_keys(str(v))


def watch_previews(d):
    """count every partial image #preview shows (they can follow each other fast)"""
    d.execute_script("""window.__previews = [];
        new MutationObserver(() => { const s = document.getElementById('preview').getAttribute('src');
            if (s) window.__previews.push(s.length); })
        .observe(document.getElementById('preview'), {attributes: true, attributeFilter: ['src']});""")


def wait_result(d, timeout=120):
    WebDriverWait(d, timeout).until(
        lambda d: d.find_element(By.ID, "result").get_attribute("src") or
        "error" in (d.find_element(By.ID, "status").get_attribute("class") or ""))
    src = d.find_element(By.ID, "result").get_attribute("src") or ""
    return base64.b64decode(src.split(",", 1)[1]) if src.startswith("data:image/png;base64,") else None


def console_errors(d, allow=()):
    return [e["message"] for e in d.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allow)]


def cmd_render(port, shot, key=None):
    d = browser()
    try:
        d.get(f"http://127.0.0.1:{port}/")
        ids = ["prompt", "seed", "steps", "width", "height", "guidance", "images", "api-key", "generate", "status",
               "preview", "result"]
        missing = [i for i in ids if not d.find_elements(By.ID, i)]
        if missing:
            return fail("the page's stable ids", f"missing {missing}")
        ok(f"GET / loads the page{' without the API key' if key else ''}: every stable id present")
        fill(d, width=64, height=64, steps=4, seed=7, guidance=4)
        d.find_element(By.ID, "prompt").send_keys("a fox")
        if key:   # without the key: refused, and said so
            d.find_element(By.ID, "generate").click()
            WebDriverWait(d, 30).until(lambda d: "401" in d.find_element(By.ID, "status").text)
            ok(f"without the key a render is refused: #status says '{d.find_element(By.ID, 'status').text[:60]}...'")
            d.find_element(By.ID, "api-key").send_keys(key)
        watch_previews(d)
        d.find_element(By.ID, "prompt").send_keys(Keys.CONTROL, Keys.ENTER)   # the keyboard starts it
        got = wait_result(d)
        previews = d.execute_script("return window.__previews.length")
        want = api_png(port, {"prompt": "a fox", "size": "64x64", "steps": 4, "seed": 7, "guidance": 4}, key)
        status = d.find_element(By.ID, "status").text
        if got == want and previews >= 1:
            ok(f"Ctrl+Enter renders: {previews} partial images in #preview, #result byte-identical to the API's "
               f"PNG ({status})")
        else:
            fail("the page renders what the API renders",
                 f"previews {previews}, result {'none' if got is None else len(got)} bytes vs {len(want)}: {status}")
        params = d.find_element(By.ID, "params").text
        hist = len(d.find_elements(By.CSS_SELECTOR, "#history li"))
        prog = d.find_element(By.ID, "progress").get_attribute("value")
        if "seed: 7" in params and hist == 1 and float(prog) == 1.0:
            ok("the final image's parameters are shown (from its PNG), the session list has it, progress full")
        else:
            fail("parameters, session list, progress", f"params {params[:80]!r}, {hist} items, progress {prog}")
        # keyboard: Tab goes from the prompt through the fields to the button
        d.find_element(By.ID, "prompt").click()
        order = []
        for _ in range(12):   # key presses to whatever has the focus (send_keys on a file input uploads)
            ActionChains(d).send_keys(Keys.TAB).perform()
            order.append(d.switch_to.active_element.get_attribute("id"))
        if "generate" in order and order.index("width") < order.index("generate"):
            ok(f"keyboard: Tab reaches every field and the button ({' > '.join(order[:order.index('generate') + 1])})")
        else:
            fail("keyboard order", order)
        d.save_screenshot(shot)
        ok(f"screenshot saved ({shot})")
        d.set_window_size(390, 844)   # a phone
        time.sleep(0.3)
        sw, iw = d.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        if sw <= iw:
            ok(f"at a phone's width (390 px) nothing scrolls sideways (content {sw} px)")
        else:
            fail("phone width", f"content {sw} px wider than the window {iw} px")
        d.save_screenshot(shot.replace(".png", "-phone.png"))
        errs = console_errors(d, allow=("401",) if key else ())
        if not errs:
            ok("no errors in the browser console" + (" (besides the refused call without the key)" if key else ""))
        else:
            fail("browser console errors", errs[:3])
    finally:
        d.quit()


def cmd_edit(port, image):
    d = browser()
    try:
        d.get(f"http://127.0.0.1:{port}/")
        fill(d, width=64, height=64, steps=2, seed=5, partials=1)
        d.find_element(By.ID, "prompt").send_keys("the fox")
        d.find_element(By.ID, "images").send_keys(image)
        d.find_element(By.ID, "generate").click()
        got = wait_result(d)
        import subprocess
        out = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/v1/images/edits", "-F", "prompt=the fox",
                              "-F", "steps=2", "-F", "seed=5", "-F", "size=64x64", "-F", f"image[]=@{image}"],
                             capture_output=True, timeout=120).stdout
        want = base64.b64decode(json.loads(out)["data"][0]["b64_json"])
        if got == want:
            ok("a reference image through #images: #result byte-identical to the API's edit")
        else:
            fail("edit through the page", f"{d.find_element(By.ID, 'status').text}")
        errs = console_errors(d)
        if errs:
            fail("browser console errors (edit)", errs[:3])
    finally:
        d.quit()


if __name__ == "__main__":
    {"render": cmd_render, "edit": cmd_edit}[sys.argv[1]](*sys.argv[2:])
