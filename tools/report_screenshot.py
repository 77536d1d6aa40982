"""docs/img/report-top-block.png (issue 46's "must show"): the top of a compare report of the six
variants of a real clip (evalkit.testing.variants: the shift, the 48x48 garbage block, flicker,
crf32, crf16, +-1 LSB; against `evalkit floor`'s re-encode floor), rendered by Debian's
Chromium through Playwright: the headline and the clip lines name the block with its frames
and place, and the noise below the floor in one line with its dB.

    PYTHONPATH=$PWD python tools/report_screenshot.py [--report DIR] [--work DIR] [--plots PNG]

``--report``: a report already made from the variants (tests/test_story.py's, say); without it
the runs are made and compared here (about 3 min on 2 cores, 24 frames). ``--plots
docs/img/report-plots.png``: also the clips' plots, on shared axes with each clip's floor band
(and ``report-plots-grid.png``: the six plots side by side).
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
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=None, help="a compare report of the variants")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "report-top-block.png")
    ap.add_argument(
        "--plots",
        type=Path,
        default=None,
        metavar="PNG",
        help="also the first clips' plots (shared axes, floor bands: issue 46 item 6)",
    )
    args = ap.parse_args()
    report = args.report
    if report is None:
        from evalkit.cli import main as evalkit
        from evalkit.testing.variants import make_variant_runs

        work = args.work or Path(tempfile.mkdtemp(prefix="evalkit-report-"))
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
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1150, "height": 560})
            page.goto((report / "index.html").as_uri())
            text = page.inner_text("body")
            assert "a local glitch on frame" in text, "the report does not name the block"
            page.screenshot(path=str(args.out))
            if args.plots is not None:
                page.set_viewport_size({"width": 1150, "height": 1400})
                page.locator("p.plot-axes").scroll_into_view_if_needed()
                top = page.evaluate(
                    "document.querySelector('p.plot-axes').getBoundingClientRect().top + window.scrollY"
                )
                page.screenshot(
                    path=str(args.plots),
                    full_page=True,
                    clip={"x": 0, "y": top - 40, "width": 1150, "height": 1400},
                )
        finally:
            browser.close()
    from PIL import Image

    grid = None
    if args.plots is not None:  # every clip's plot side by side: one axis for all
        grid = args.plots.with_name(args.plots.stem + "-grid.png")
        plots = [Image.open(p).convert("RGB") for p in sorted((report / "img").glob("*_timeline.png"))]
        w, h = plots[0].size
        sheet = Image.new("RGB", (2 * w, -(-len(plots) // 2) * h), "white")
        for i, im in enumerate(plots):
            sheet.paste(im, ((i % 2) * w, (i // 2) * h))
        sheet.save(grid)
    for png in (args.out, args.plots, grid):
        if png is not None:
            Image.open(png).convert("RGB").quantize(colors=64).save(png, optimize=True)
            print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
