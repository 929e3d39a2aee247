"""The support story, walked in the console as a person would, on two
instances of one deployment (tests/console/run starts them):

1. a wrong token is refused;
2. the overview shows the store and the policies;
3. the blocks page lists the block support was called about;
4. the top-denied page lists the blocked identity's denials;
5. the blocked identity is looked up (explain) with the keyboard alone;
6. it is unblocked from the console, and its next /check is admitted; its
   counters are reset;
7. the audit log shows that unblock, by the token's name;
8. an override ending in the past is refused, the problem's detail and
   field shown; one with an end time, added on the first instance, is
   listed on the second and decides its checks within a second; removed
   there, it stops deciding the first's;
9. the overview at 375 px wide needs no sideways scrolling.

Each page is screenshotted (browser.SHOTS). A step that needs a route the
server lacks fails, unless CONSOLE_WITHOUT names that route: then it is
reported as not run, by name, at the end.
"""

import sys
import time
from datetime import datetime, timedelta

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

import browser as b
from browser import FIRST, SECOND, StoryFailed

EMAIL, IP = "alice@example.com", "203.0.113.7"
ALICE = {"email": EMAIL, "ip": IP}
REASON = "support ticket 4711: credential stuffing"
NOTE = "console story: carol's card declined"
CAROL = {"email": "carol@example.com", "ip": "198.51.100.20"}

passed, not_run = [], []


def login(identifiers, cost=1):
    return {"policy": "login", "identifiers": identifiers, "cost": cost}


def step(name, needs=None):
    """Runs the step below it. One that needs a route the server lacks
    fails, unless CONSOLE_WITHOUT names the route: it then checks that the
    page says so clearly, and is reported as not run."""
    def run(body):
        if needs and not ROUTES[needs] and needs not in b.WITHOUT:
            raise StoryFailed("%s: the server has no %s route (PGLIMIT_CONSOLE_WITHOUT=%s names it as known "
                              "missing)" % (name, needs, needs))
        print("console: %s" % name, flush=True)
        body()
        if needs and not ROUTES[needs]:
            not_run.append("%s (waits on %s; the page said the route answers 404)" % (name, needs))
        else:
            passed.append(name)
        return body
    return run


def missing(driver, problem, route):
    """The clear message a page shows for a route the server lacks."""
    b.wait_text(driver, problem, route + " answers 404")


def setup():
    """Alice's identity blocked by an operator, her checks then denied."""
    status, answer = b.http("POST", FIRST + "/admin/blocks",
                            {"policy": "login", "identifiers": ALICE, "for": "1h", "reason": REASON}, b.bearer())
    if status != 200:
        raise StoryFailed("setting up the block: %s %s" % (status, answer))
    for _ in range(3):
        status, answer = b.http("POST", FIRST + "/check", login(ALICE))
        if status != 429:
            raise StoryFailed("a blocked identity's check answered %s: %s" % (status, answer))


def main(driver):
    setup()

    @step("a wrong token is refused")
    def _():
        b.sign_in(driver, FIRST, b.TOKEN + "-wrong")
        b.wait_text(driver, "who", "The token was refused", "not valid")
        b.screenshot(driver, "refused")

    @step("the overview shows the store and the policies")
    def _():
        b.sign_in(driver, FIRST, b.bearer())
        b.wait_text(driver, "who", "Using an admin token")
        b.wait_text(driver, "overview-store", "postgres")
        b.wait_text(driver, "overview-policies", "login", "email_ip", "fixed_window")
        b.wait_text(driver, "overview-minutes", "minute", "checks", "denied")
        b.screenshot(driver, "overview")

    @step("the blocks page lists the block support was called about")
    def _():
        b.go(driver, "blocks")
        b.wait_text(driver, "blocks-result", REASON, "admin", "email_ip")
        b.screenshot(driver, "blocks")

    @step("the top-denied page lists the blocked identity's denials", needs="top")
    def _():
        b.go(driver, "top")
        if ROUTES["top"]:
            b.wait_text(driver, "top-result", "login", "email")
        else:
            missing(driver, "top-problem", "GET /admin/top")
        b.screenshot(driver, "top")

    @step("the blocked identity is looked up (explain) with the keyboard alone", needs="explain")
    def _():
        b.go(driver, "lookup")
        keyboard_lookup(driver)
        if ROUTES["explain"]:
            b.wait_text(driver, "lookup-result", "Denied (blocked)", REASON)
        else:
            missing(driver, "lookup-problem", "POST /admin/explain")
        b.screenshot(driver, "lookup")

    @step("it is unblocked from the console, and its next check is admitted")
    def _():
        b.by_id(driver, "act-unblock").click()
        b.wait_text(driver, "act-done", "Unblocked", "login/email")
        status, answer = b.http("POST", FIRST + "/check", login(ALICE))
        if status != 200:
            raise StoryFailed("after the unblock, the check answered %s: %s" % (status, answer))
        if ROUTES["explain"]:
            b.wait_text(driver, "lookup-result", "Allowed")
        b.screenshot(driver, "lookup-unblocked")
        b.by_id(driver, "act-reset").click()
        b.wait_text(driver, "act-done", "Reset: the counters of this identity start afresh")

    @step("the audit log shows the unblock by the token's name", needs="audit")
    def _():
        b.go(driver, "audit")
        if ROUTES["audit"]:
            b.wait_text(driver, "audit-result", "unblock", b.TOKEN.split(":")[0])
        else:
            missing(driver, "audit-problem", "GET /admin/audit")
        b.screenshot(driver, "audit")

    @step("an override with an end time reaches the second instance within a second")
    def _():
        override_on_two_instances(driver)

    @step("the overview at 375 px wide needs no sideways scrolling")
    def _():
        driver.set_window_size(*b.PHONE)
        b.go(driver, "overview")
        b.wait_text(driver, "overview-policies", "email_ip")
        wide = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        if wide[0] > wide[1]:
            raise StoryFailed("at 375 px the page is %d px wide (the window: %d)" % tuple(wide))
        b.screenshot(driver, "phone")
        driver.set_window_size(*b.DESKTOP)


def keyboard_lookup(driver):
    """Tabs from the section's heading through the form, typing as it goes,
    and submits with Enter; each field must be where Tab leads, focused
    visibly."""
    def tab_to(element_id):
        driver.switch_to.active_element.send_keys(Keys.TAB)
        focused = driver.switch_to.active_element
        if focused.get_attribute("id") != element_id:
            raise StoryFailed("Tab led to #%s, not #%s" % (focused.get_attribute("id"), element_id))
        outline = driver.execute_script("return getComputedStyle(document.activeElement).outlineStyle")
        if outline in ("none", ""):
            raise StoryFailed("#%s has focus but no visible outline" % element_id)
        return focused

    b.wait_until(driver, "the policies in the look-up form",
                 lambda d: "login" in [o.text for o in Select(b.by_id(d, "lookup-policy")).options])
    driver.execute_script("document.getElementById('lookup-title').focus()")
    driver.switch_to.active_element.send_keys(Keys.TAB)  # the first radio: a policy
    tab_to("lookup-policy").send_keys("login")
    tab_to("lookup-id-email").send_keys(EMAIL)
    tab_to("lookup-id-ip").send_keys(IP)
    tab_to("lookup-explain")
    driver.switch_to.active_element.send_keys(Keys.ENTER)


def set_until(driver, local):
    """The end of an override, in the browser's local time (this machine's):
    a datetime-local field's typed form depends on the locale, its value
    does not."""
    value = local.replace(microsecond=0).isoformat()
    driver.execute_script("const u = document.getElementById('override-until'); u.value = arguments[0];"
                          "u.dispatchEvent(new Event('input'))", value)


def override_on_two_instances(driver):
    first = driver.current_window_handle
    driver.switch_to.new_window("window")
    second = driver.current_window_handle
    b.sign_in(driver, SECOND, b.bearer())
    b.go(driver, "overrides")
    driver.switch_to.window(first)
    b.go(driver, "overrides")
    Select(b.by_id(driver, "override-policy")).select_by_visible_text("login")
    b.by_id(driver, "override-when-email").send_keys(CAROL["email"])
    driver.find_element(By.CSS_SELECTOR, 'input[name="override-action"][value="deny"]').click()
    b.by_id(driver, "override-note").send_keys(NOTE)
    set_until(driver, datetime.now() - timedelta(hours=1))
    b.by_id(driver, "override-add").click()
    b.wait_text(driver, "override-problem", "until is in the past", "[field: until]")
    set_until(driver, datetime.now() + timedelta(hours=2))
    status = b.http("POST", SECOND + "/check", login(CAROL, cost=0))[0]
    if status != 200:
        raise StoryFailed("before the override, carol's check on the second instance answered %s" % status)
    b.by_id(driver, "override-add").click()
    b.wait_text(driver, "override-done", "Added override", "until")
    added = time.monotonic()
    took = b.poll("the override deciding the second instance's checks",
                  lambda: b.http("POST", SECOND + "/check", login(CAROL, cost=0))[0] == 429,
                  added, b.OVERRIDES_REACH_S)
    print("console:   the second instance denied carol %.0f ms after the add was answered" % (took * 1000))
    b.wait_text(driver, "overrides-result", NOTE)
    b.screenshot(driver, "overrides")
    driver.switch_to.window(second)
    b.by_id(driver, "overrides-refresh").click()
    b.wait_text(driver, "overrides-result", NOTE, "deny")
    driver.find_element(By.CSS_SELECTOR, "#overrides-result button").click()
    b.wait_text(driver, "override-done", "Removed override")
    removed = time.monotonic()
    b.poll("the removal reaching the first instance",
           lambda: b.http("POST", FIRST + "/check", login(CAROL, cost=0))[0] == 200, removed, b.OVERRIDES_REACH_S)
    driver.close()
    driver.switch_to.window(first)


if __name__ == "__main__":
    ROUTES = {
        "explain": b.route_present("POST", "/admin/explain", login(ALICE, cost=0)),
        "top": b.route_present("GET", "/admin/top"),
        "audit": b.route_present("GET", "/admin/audit"),
    }
    driver = b.browser()
    try:
        main(driver)
    except StoryFailed as failure:
        print("console: FAILED: %s" % failure, file=sys.stderr, flush=True)
        print("console: %d passed, 1 failed" % len(passed))
        sys.exit(1)
    finally:
        driver.quit()
    for name in not_run:
        print("console: NOT RUN, PGLIMIT_CONSOLE_WITHOUT: %s" % name)
    print("console: %d passed, 0 failed" % len(passed))
