"""Driving the rater page (the Gradio app at ``/``) from Playwright, the way a rater does.

The page's load and answer are Gradio events whose replies arrive over Gradio's event stream,
not as plain HTTP responses; the page exposes each reply it rendered through a read-only hook,
``window.evalkitState()`` -> ``{"replies": n, "state": last reply}``, and the players' sync
state through ``window.evalkitPlayers()``. These helpers wait on those hooks.
"""

from __future__ import annotations

ENABLED = (
    "document.body.dataset.finished === '1' || (document.querySelector('#answers button')"
    " && !document.querySelector('#answers button').disabled)"
)
KEYS = {"left": "1", "right": "2", "same": "3", "A": "a", "B": "b"}
TIMEOUT_MS = 30000


def replies(page) -> int:
    return page.evaluate("window.evalkitState ? window.evalkitState().replies : 0")


def wait_reply(page, after: int) -> dict:
    """The first reply rendered after ``after`` replies (the service's view, as the page got it)."""
    page.wait_for_function(
        f"window.evalkitState && window.evalkitState().replies > {after}", timeout=TIMEOUT_MS
    )
    return page.evaluate("window.evalkitState().state")


def open_page(page, url: str, token: str | None, *, reload: bool = False) -> dict:
    """Go to the invite link (or reload) and return the first reply (the current trial)."""
    if reload:
        page.reload()
    else:
        page.goto(f"{url}/?token={token}" if token is not None else f"{url}/")
    return wait_reply(page, 0)


def answer(page, choice: str, how: str = "click") -> dict:
    """Wait until the answers are enabled (one play-through), answer ``choice`` by ``how``
    ("click", "key" or "tap") and return the reply."""
    page.wait_for_function(ENABLED, timeout=TIMEOUT_MS)
    n = replies(page)
    sel = f"#answers button[data-answer='{choice}']"
    if how == "key":
        page.keyboard.press(KEYS[choice])
    elif how == "tap":
        page.tap(sel)
    else:
        page.click(sel)
    return wait_reply(page, n)


_BOXES = (
    "(sel) => Array.from(document.querySelectorAll(sel)).map(e => {"
    " const b = e.getBoundingClientRect(); return {slot: e.dataset.slot,"
    " x: b.x, y: b.y, w: b.width, h: b.height}; })"
)


def boxes(page, selector: str) -> list[dict]:
    """Bounding boxes (viewport coordinates) of every element matching ``selector``."""
    return page.evaluate(_BOXES, selector)


def layout(page, selectors) -> dict:
    """The viewport (``vw``, ``vh``), the page's scroll size (``sw``, ``sh``) and the
    :func:`boxes` of each of ``selectors`` (``boxes[selector]``), read in one round trip at
    one moment."""
    return page.evaluate(
        "(sels) => { const boxes = " + _BOXES + "; const s ="
        " document.scrollingElement; return {vw: innerWidth, vh: innerHeight,"
        " sw: s.scrollWidth, sh: s.scrollHeight,"
        " boxes: Object.fromEntries(sels.map(q => [q, boxes(q)]))}; }",
        list(selectors),
    )


def inside(bs: list[dict], vw: float, vh: float) -> bool:
    """There are boxes, and each lies wholly inside a ``vw`` x ``vh`` viewport."""
    return bool(bs) and all(
        b["w"] > 0
        and b["h"] > 0
        and b["x"] >= 0
        and b["y"] >= 0
        and b["x"] + b["w"] <= vw + 0.5
        and b["y"] + b["h"] <= vh + 0.5
        for b in bs
    )


def in_viewport(page, selector: str) -> bool:
    """Every element matching ``selector`` lies wholly inside the viewport, with no scrolling."""
    g = layout(page, [selector])
    return inside(g["boxes"][selector], g["vw"], g["vh"])


def admin_results(page, sid, password: str, *, pattern: str = "verdict", timeout_ms: int = 60000) -> str:
    """On the admin page's login form: sign in as ``admin``, show study ``sid``'s results and
    wait until the verdict box matches ``pattern`` (a JavaScript regular expression); return
    its text."""
    page.fill("input[type=text]", "admin")
    page.fill("input[type=password]", password)
    page.keyboard.press("Enter")
    page.wait_for_selector("#studies", timeout=TIMEOUT_MS)
    page.fill("#study-id input", str(sid))
    page.click("#show-results")
    page.wait_for_function(
        "document.querySelector('#verdict') && "
        f"/{pattern}/.test(document.querySelector('#verdict').innerText)",
        timeout=timeout_ms,
    )
    return page.inner_text("#verdict")
