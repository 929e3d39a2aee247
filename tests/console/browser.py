"""What the console's story stands on: the two instances' addresses and
token (from tests/console/run), plain HTTP calls to them, a headless
Chromium under Selenium, and waits that fail saying what the page showed.

Every wait is bounded by a time the service is configured with, never by a
guess at this machine's speed: an answer shown on the page is waited for as
long as the server may take to answer at all (its request timeout), and an
override on the second instance as long as overrides take to reach every
instance.
"""

import json
import os
import shutil
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

FIRST = os.environ["CONSOLE_FIRST"]
SECOND = os.environ["CONSOLE_SECOND"]
TOKEN = os.environ["CONSOLE_TOKEN"]
SHOTS = os.environ["CONSOLE_SHOTS"]
WITHOUT = {r for r in os.environ.get("CONSOLE_WITHOUT", "").split(",") if r}

# The instances' PGLIMIT_REQUEST_TIMEOUT_MS: the longest a request may take
# before its 503, so the longest before the page has an answer to show.
REQUEST_TIMEOUT_S = int(os.environ["CONSOLE_REQUEST_TIMEOUT_MS"]) / 1000
# "Applied by every instance within a second" (POST /admin/overrides).
OVERRIDES_REACH_S = 1.0
DESKTOP = (1280, 1000)
PHONE = (375, 812)


class StoryFailed(Exception):
    """A step did not go as a person would expect; the message says how."""


def http(method, url, body=None, token=None):
    """(status, JSON body or None) of one call; never raises on a 4xx/5xx."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def bearer():
    """The bearer the admin token `name:secret` is presented as: the whole
    of it where a name is part of the token, its secret where names are
    understood."""
    for candidate in (TOKEN, TOKEN.split(":", 1)[-1]):
        if http("GET", FIRST + "/admin/overview", token=candidate)[0] == 200:
            return candidate
    raise StoryFailed("neither " + TOKEN.split(":")[0] + "'s whole token nor its secret opens /admin/overview")


def route_present(method, path, body=None):
    """Whether the server has a route: the router's 404 ("no resource at
    …") says it has not; anything else (400, 422, 200) is the route's."""
    status, answer = http(method, FIRST + path, body, bearer())
    unknown = status == 404 and isinstance(answer, dict) and str(answer.get("detail")).startswith("no resource at")
    return not unknown


def browser():
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    # --no-sandbox: Chromium will not start its sandbox as root, which CI runs as.
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=%d,%d" % DESKTOP, "--force-device-scale-factor=1"):
        options.add_argument(flag)
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def shown(driver):
    """What the page shows now, for a failure's message."""
    try:
        return driver.find_element(By.TAG_NAME, "body").text.strip().replace("\n", " | ")[:1500]
    except Exception as error:  # the page itself may be what failed
        return "(no page: %s)" % error


def wait_until(driver, what, predicate, within=REQUEST_TIMEOUT_S):
    """Waits until `predicate(driver)` is true, or fails naming `what`."""
    try:
        return WebDriverWait(driver, within, poll_frequency=0.05).until(lambda d: predicate(d))
    except TimeoutException:
        raise StoryFailed("waited %.1f s for %s; the page shows: %s" % (within, what, shown(driver))) from None


def by_id(driver, element_id):
    return driver.find_element(By.ID, element_id)


def text_of(driver, element_id):
    element = by_id(driver, element_id)
    return element.text if element.is_displayed() else ""


def wait_text(driver, element_id, *parts):
    """Waits until element `element_id` is shown and holds every one of `parts`."""
    what = "#%s to show %s" % (element_id, " and ".join(repr(p) for p in parts))
    return wait_until(driver, what, lambda d: all(p in text_of(d, element_id) for p in parts))


def go(driver, section):
    """Opens a section by its link in the navigation, as a person clicks it."""
    driver.find_element(By.CSS_SELECTOR, 'nav a[href="#%s"]' % section).click()
    wait_until(driver, "the %s section" % section, lambda d: by_id(d, section).is_displayed())


def screenshot(driver, name):
    """The whole page at the window's width, as tall as it is."""
    path = os.path.join(SHOTS, name + ".png")
    width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
    tall = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, max(height, min(tall + 120, 4000)))
    saved = driver.save_screenshot(path)
    driver.set_window_size(width, height)
    if not saved:
        raise StoryFailed("could not write the screenshot " + path)


def sign_in(driver, base, token):
    """Opens the console at `base` and types `token`, submitted with Enter."""
    driver.get(base + "/console#overview")
    field = by_id(driver, "token")
    field.send_keys(token)
    field.send_keys("\n")
    wait_until(driver, "the token to be taken or refused",
               lambda d: by_id(d, "who").get_attribute("class") in ("ok", "refused"))


def poll(what, seen, since, within):
    """Calls `seen()` until true; passes if a call started within `within`
    seconds of `since` (a time.monotonic()) saw it. Returns how long after
    `since` the call that first saw it started."""
    start = since
    while True:
        began = time.monotonic()
        if seen():
            return began - start
        if began - start > within:
            raise StoryFailed("%s: not seen by any call started within %.1f s" % (what, within))
        time.sleep(0.02)
