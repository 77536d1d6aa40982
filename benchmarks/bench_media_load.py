"""Media raters can load (issue 36 item 3, issue 45 item 6): per trial, the bytes a rater's
browser gets and the time to the first frame on screen at 20 and 100 Mbit/s, for a 1280x720 x
10 s clip, with and without ``study create --excerpt 2``, for ``--delivery stream`` (H.264) or
``lossless`` (animated lossless WebP) and ``--protocol preference`` or ``abx``.

Steps, through the product's own paths:

1. a scale720 clip (``datasets/make_scale.py``: the canary's ``astronaut_pan`` filmed at
   1280x720 for 240 frames) as run A, and as run B the same frames lightly blurred (sigma 0.6)
   with a stronger blur (sigma 1.5) over frames 120-167 (a backend whose difference peaks at
   5-7 s), both imported (``render -r import``) and compared on the CPU (real LPIPS);
2. ``evalkit study create --protocol preference`` from that report, whole clips and with
   ``--excerpt 2`` (the window of highest mean per-frame LPIPS), each timed as a whole process;
3. each study served by the real ``evalkit serve``; for each rate, fresh raters open their
   invite link in Chromium with ``Network.emulateNetworkConditions`` (latency 20 ms, down and
   up at the rate) set through CDP before the page loads. Per rater's first trial: the stream's
   size, the bytes its media requests took on the wire (CDP ``loadingFinished``
   ``encodedDataLength``, headers included, every request summed), the time from the first
   media request to the first frame drawn in every box of the page (``window.evalkitPlayers``,
   polled every animation frame) and to the last media byte (``loadingFinished``). For a
   lossless trial, also the page's decode time: the same file fetched again in the page and
   every frame decoded by ``ImageDecoder`` (ms per frame: playback runs at the clip's frame
   rate only where this is under 1000 / fps).

Times are the host's clock as the browser reports events (a benchmark, not a test).

    .venv/bin/python benchmarks/bench_media_load.py [--raters 2] [--rates 20,100]
                                                   [--work /tmp/evalkit-media-load]
                                                   [--delivery lossless] [--protocol abx]
                                                   [--lengths excerpt,whole]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "datasets"))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import numpy as np  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.testing.server import Server  # noqa: E402
from evalkit.testing.studies import import_report  # noqa: E402

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
FIRST_FRAME = (
    "() => { const p = window.evalkitPlayers && window.evalkitPlayers();"
    " return !!(p && p.length && p.every(b => b.t === b.t)); }"
)
CLIP = "astronaut_pan"
WORSE = range(120, 168)


def make_report(work: Path, frames: int = 0) -> Path:
    """The scale720 clip as A, A blurred as B, imported and compared (made once per ``work``);
    ``frames``: only the clip's first so many (0: all 240)."""
    import make_scale
    from scipy.ndimage import gaussian_filter

    from evalkit.video import read_frames

    report = work / "pair" / "report"
    if (report / "summary.json").is_file():
        return report
    src = work / "scale720" / "clips" / f"{CLIP}.mkv"
    if not src.is_file():
        make_scale.generate("scale720", work, clips=[CLIP], verbose=True)
    fa, fps = read_frames(src)
    if frames:
        fa = np.ascontiguousarray(fa[:frames])
    fb = np.empty_like(fa)
    for i, f in enumerate(fa):
        fb[i] = gaussian_filter(f, (1.5, 1.5, 0) if i in WORSE else (0.6, 0.6, 0))
    t0 = time.perf_counter()
    rep, _ = import_report(work / "pair", {"studio": (fa, fb)}, fps)
    print(f"imports and compare: {time.perf_counter() - t0:.1f} s", flush=True)
    return rep


def create(
    report: Path,
    db: Path,
    excerpt: str | None,
    delivery: str = "stream",
    protocol: str = "preference",
    allow_masking: bool = False,
) -> dict:
    """``evalkit study create`` as a process; its wall time and the study's stream sizes."""
    args = [
        sys.executable,
        "-m",
        "evalkit",
        "study",
        "create",
        str(report),
        "--db",
        str(db),
        "--protocol",
        protocol,
        "--raters",
        "2",
        "--seed",
        "1",
        "--delivery",
        delivery,
    ]
    if excerpt:
        args += ["--excerpt", excerpt]
    if allow_masking:
        args.append("--allow-masking")
    t0 = time.perf_counter()
    run = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if run.returncode:
        raise SystemExit(f"study create failed: {run.stderr.strip()}")
    ext = ".webp" if delivery == "lossless" else ".mp4"
    sizes = [p.stat().st_size for p in db.with_suffix(".media").glob(f"*{ext}")]
    return {
        "wall_s": wall,
        "out": run.stdout.strip(),
        "streams": len(sizes),
        "median_bytes": statistics.median(sizes),
        "total_bytes": sum(sizes),
    }


def kept(db: Path, delivery: str) -> dict:
    """An earlier run's study (--keep-study): its stream sizes, nothing timed."""
    ext = ".webp" if delivery == "lossless" else ".mp4"
    sizes = [p.stat().st_size for p in db.with_suffix(".media").glob(f"*{ext}")]
    return {
        "wall_s": 0.0,
        "out": "kept from an earlier run",
        "streams": len(sizes),
        "median_bytes": statistics.median(sizes),
        "total_bytes": sum(sizes),
    }


# a lossless trial's file fetched again in the page, then every frame decoded (ms per frame)
DECODE = """async () => {
  const t = window.evalkitState().state.trial, name = Object.values(t.media)[0];
  const token = new URLSearchParams(location.search).get("token");
  const buf = await (await fetch("media/" + name + "?token=" + token)).arrayBuffer();
  const t0 = performance.now();
  const dec = new ImageDecoder({data: buf, type: "image/webp", colorSpaceConversion: "none"});
  await dec.tracks.ready; await dec.completed;
  const n = dec.tracks.selectedTrack.frameCount;
  let w = 0, h = 0;
  for (let i = 0; i < n; i++) {
    const r = await dec.decode({frameIndex: i}); w = r.image.displayWidth;
    h = r.image.displayHeight; r.image.close();
  }
  const ms = performance.now() - t0; dec.close();
  return {frames: n, ms_per_frame: ms / n, width: w, height: h, bytes: buf.byteLength};
}"""


def load_first_trial(browser, url: str, token: str, mbit: float, lossless: bool = False) -> dict:
    """One rater's first trial in a fresh context throttled to ``mbit`` (latency 20 ms)."""
    ctx = browser.new_context()
    page = ctx.new_page()
    cdp = ctx.new_cdp_session(page)
    cdp.send("Network.enable")
    rate = mbit * 1e6 / 8
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 20, "downloadThroughput": rate, "uploadThroughput": rate},
    )
    media: dict[str, dict] = {}

    def sent(e):
        if "/media/" in e["request"]["url"]:
            media[e["requestId"]] = {"start": time.perf_counter(), "end": None, "bytes": 0}

    def finished(e):
        m = media.get(e["requestId"])
        if m is not None:
            m["end"], m["bytes"] = time.perf_counter(), e["encodedDataLength"]

    def failed(e):
        m = media.get(e["requestId"])
        if m is not None:
            m["end"], m["failed"] = time.perf_counter(), e.get("errorText")

    cdp.on("Network.requestWillBeSent", sent)
    cdp.on("Network.loadingFinished", finished)
    cdp.on("Network.loadingFailed", failed)
    try:
        t_nav = time.perf_counter()
        page.goto(f"{url}/?token={token}", timeout=120_000)
        page.wait_for_function(FIRST_FRAME, polling="raf", timeout=120_000)
        t_first = time.perf_counter()
        deadline = time.perf_counter() + 180
        while (not media or any(m["end"] is None for m in media.values())) and time.perf_counter() < deadline:
            page.wait_for_timeout(50)
        start = min(m["start"] for m in media.values())
        done = [m for m in media.values() if m["end"] is not None]
        page.set_default_timeout(600_000)
        decode = page.evaluate(DECODE) if lossless else None
        return {
            "requests": len(media),
            "wire_bytes": sum(m["bytes"] for m in done),
            "failed": sum(1 for m in done if m.get("failed")),
            "first_frame_s": t_first - start,
            "whole_s": max(m["end"] for m in done) - start,
            "page_s": start - t_nav,
            "decode": decode,
        }
    finally:
        ctx.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/evalkit-media-load"))
    ap.add_argument("--raters", type=int, default=2, help="fresh raters per study and rate")
    ap.add_argument("--rates", default="20,100", help="Mbit/s, comma-separated")
    ap.add_argument("--excerpt", default="2", help="seconds of the excerpt study")
    ap.add_argument("--delivery", default="stream", choices=("stream", "lossless"))
    ap.add_argument("--protocol", default="preference", choices=("preference", "abx"))
    ap.add_argument(
        "--allow-masking",
        action="store_true",
        help="stream studies the delivery rule refuses are made anyway (bytes only)",
    )
    ap.add_argument(
        "--lengths", default="excerpt,whole", help="which studies: excerpt, whole or both (comma-separated)"
    )
    ap.add_argument(
        "--frames", type=int, default=0, help="only the clip's first N frames (a cheaper compare; 0: all 240)"
    )
    ap.add_argument(
        "--keep-study",
        action="store_true",
        help="serve the study an earlier run made in --work (another checkout's "
        "page against the same files) instead of making it again",
    )
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.work.mkdir(parents=True, exist_ok=True)
    report = make_report(args.work, args.frames)
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    # the excerpt first: the whole clips' study takes minutes more to encode
    lengths = args.lengths.split(",")
    for name, ex in ((f"--excerpt {args.excerpt}", args.excerpt), ("whole 10 s", None)):
        if ("whole" if ex is None else "excerpt") not in lengths:
            continue
        name = f"{args.delivery} {args.protocol} {name}"
        db = args.work / (f"study_{args.delivery}_{args.protocol}_{'whole' if ex is None else 'excerpt'}.db")
        if args.keep_study and db.is_file():
            made = kept(db, args.delivery)
        else:
            for p in (db, db.with_suffix(".db-wal"), db.with_suffix(".db-shm")):
                p.unlink(missing_ok=True)
            if db.with_suffix(".media").is_dir():
                for p in db.with_suffix(".media").iterdir():
                    p.unlink()
            made = create(report, db, ex, args.delivery, args.protocol, args.allow_masking)
        print(
            f"{name}: study create {made['wall_s']:.1f} s, {made['streams']} streams, median "
            f"{made['median_bytes'] / 1e6:.2f} MB, all {made['total_bytes'] / 1e6:.1f} MB "
            f"({made['out'].splitlines()[-1].strip() if ex else 'whole clips'})",
            flush=True,
        )
        server = Server(db).start()
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    for mbit in rates:
                        for tok in study.invite(db, 1, args.raters):
                            r = load_first_trial(
                                browser, server.url, tok["token"], mbit, args.delivery == "lossless"
                            )
                            r.update(study=name, mbit=mbit, stream_bytes=made["median_bytes"])
                            rows.append(r)
                            print(
                                f"  {mbit:g} Mbit/s: first frame {r['first_frame_s']:.2f} s, "
                                f"whole file {r['whole_s']:.2f} s, {r['wire_bytes'] / 1e6:.2f} "
                                f"MB on the wire in {r['requests']} request(s)"
                                f"{', failed ' + str(r['failed']) if r['failed'] else ''}; "
                                f"page before the first media request {r['page_s']:.2f} s"
                                + (
                                    ""
                                    if not r["decode"]
                                    else f"; page decode {r['decode']['ms_per_frame']:.1f} ms a "
                                    f"frame ({r['decode']['frames']} frames of "
                                    f"{r['decode']['width']}x{r['decode']['height']})"
                                ),
                                flush=True,
                            )
                finally:
                    browser.close()
        finally:
            server.stop()
    print("\n| study | Mbit/s | stream MB | MB on the wire | first frame s | whole file s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in dict.fromkeys(r["study"] for r in rows):
        for mbit in rates:
            rs = [r for r in rows if r["study"] == name and r["mbit"] == mbit]
            med = {k: statistics.median(r[k] for r in rs) for k in ("wire_bytes", "first_frame_s", "whole_s")}
            print(
                f"| {name} | {mbit:g} | {rs[0]['stream_bytes'] / 1e6:.2f} | "
                f"{med['wire_bytes'] / 1e6:.2f} | {med['first_frame_s']:.2f} | "
                f"{med['whole_s']:.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
