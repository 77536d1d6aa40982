"""The screenshots of docs/img (issue 38's "must show"): the compare report's top for the four
variants of a real clip (evalkit.testing.variants: crf16, crf32, flicker, a one-frame shift,
against `evalkit floor`'s re-encode floor), and the admin page of an ABX study made from that
report at interim (3 of 26 planned raters done). Real runs, a real `evalkit serve`, Debian's
Chromium through Playwright.

    PYTHONPATH=$PWD python tools/story_screenshots.py [--work DIR]   # about 3 min on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> int:
    from playwright.sync_api import sync_playwright

    from evalkit import study
    from evalkit.cli import main as evalkit
    from evalkit.testing.page import admin_results
    from evalkit.testing.server import ADMIN_PASSWORD, Server
    from evalkit.testing.studies import answer, hidden
    from evalkit.testing.variants import make_variant_runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="evalkit-story-"))
    args.out.mkdir(parents=True, exist_ok=True)
    p = make_variant_runs(work, ROOT / "datasets" / "canary" / "clips" / "chelsea_handheld.mkv")
    report = work / "report"
    assert (
        evalkit(
            [
                "compare",
                str(p["a"]),
                str(p["b"]),
                "--floor",
                str(p["floor"]),
                "--out",
                str(report),
                "--device",
                "cpu",
                "--quiet",
            ]
        )
        == 0
    )
    db = work / "study.db"
    # the crf16 variant's difference is finer than a browser stream carries (delivery fidelity)
    sid = study.create_study(
        report, db, protocol="abx", clips_spec="all", raters_planned=26, seed=1, allow_masking=True
    )["study"]
    for tok in (r["token"] for r in study.invite(db, sid, 4, "pilot")[:3]):
        answer(db, tok, lambda t: hidden(db, t["trial"])["expected"] or "A")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto((report / "index.html").as_uri())
        page.screenshot(path=str(args.out / "report-top.png"))
        server = Server(db).start()
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"{server.url}/admin/")
            page.wait_for_selector("input[type=password]", timeout=30000)
            admin_results(page, sid, ADMIN_PASSWORD, pattern="INTERIM")
            page.wait_for_selector("#rater-progress table", timeout=30000)
            page.locator("#show-results").scroll_into_view_if_needed()
            page.screenshot(path=str(args.out / "admin-interim.png"), full_page=True)
        finally:
            server.stop()
            browser.close()
    from PIL import Image

    for name in ("report-top.png", "admin-interim.png"):  # small PNGs: 64-colour palette
        path = args.out / name
        Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
