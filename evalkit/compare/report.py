"""Compare report writers: frames.csv, clips.csv, summary.json and an offline index.html.

Columns (units: ``summary.json["units"]``; README "Compare report"; the metric columns are
the keys of :mod:`metrics.catalogue`, in its order):

- ``frames.csv``: job, clip, prompt, seed, frame, then one column per metric (empty where a
  metric is undefined, e.g. temporal metrics at frame 0; ``inf`` for the PSNR of identical frames).
- ``clips.csv``: job, clip, prompt, seed, status (``compared`` or why not), frames,
  worst_frame (highest LPIPS), identical, then ``<metric>_mean``, ``<metric>_p95``,
  ``<metric>_worst`` per metric.
"""
from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path

import numpy as np

from evalkit.compare.aggregate import aggregate
from evalkit.fsutil import atomic_path, atomic_write_bytes, atomic_write_text, write_csv
from metrics.catalogue import KEYS, fmt


def _cell(v):
    """The report CSVs' cells: bools as true/false, nan as an empty cell (None too: write_csv)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _write_csv(path: Path, header: list[str], rows) -> None:
    write_csv(path, header, ([_cell(v) for v in row] for row in rows))


def _job_cols(rec: dict) -> list:
    return [rec["id"], rec["clip"], rec["prompt"], rec.get("effective_seed", rec["seed"])]


def write_frames_csv(path: Path, measures) -> None:
    def rows():
        for m in measures:
            for r in m.records:
                yield _job_cols(m.pair.rec_a) + [r["frame"]] + [r.get(k) for k in KEYS]

    _write_csv(path, ["job", "clip", "prompt", "seed", "frame", *KEYS], rows())


def write_clips_csv(path: Path, measures, not_compared: dict, jobs_by_id: dict) -> None:

    header = ["job", "clip", "prompt", "seed", "status", "frames", "worst_frame", "identical"]
    for k in KEYS:
        header += [f"{k}_mean", f"{k}_p95", f"{k}_worst"]
    rows = []
    for m in measures:
        row = _job_cols(m.pair.rec_a) + ["compared", len(m.records), m.worst_frame,
                                         m.summary["identical"]]
        for k in KEYS:
            agg = aggregate([r.get(k) for r in m.records], k)
            row += [agg["mean"], agg["p95"], agg["worst"]]
        rows.append(row)
    for jid, reason in not_compared.items():
        rec = jobs_by_id.get(jid, {"id": jid, "clip": "", "prompt": "", "seed": ""})
        rows.append(_job_cols(rec) + [reason, 0, None, None] + [None] * (3 * len(KEYS)))
    _write_csv(path, header, rows)


# -- images --------------------------------------------------------------------------------

def _save_png(path: Path, rgb: np.ndarray) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())


def worst_segment(values: list[float], width: int) -> tuple[int, int]:
    """[start, end) of the window of ``width`` frames with the highest mean."""
    arr = np.asarray(values, dtype=np.float64)
    if len(arr) <= width:
        return 0, len(arr)
    sums = np.convolve(arr, np.ones(width), mode="valid")
    start = int(np.argmax(sums))
    return start, start + width


def _timeline(path: Path, m) -> tuple[int, int]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = [r["frame"] for r in m.records]
    lp = [r["lpips"] for r in m.records]
    ss = [r["ssim"] for r in m.records]
    seg = worst_segment(lp, max(1, min(8, len(lp) // 4)))
    fig, ax = plt.subplots(figsize=(7, 2.4), dpi=100)
    ax.plot(frames, lp, color="#c0392b", marker=".", label="LPIPS")
    ax.set_xlabel("frame")
    ax.set_ylabel("LPIPS", color="#c0392b")
    ax.axvspan(seg[0] - 0.5, seg[1] - 0.5, color="#f5b7b1", alpha=0.5, label="worst segment")
    ax2 = ax.twinx()
    ax2.plot(frames, ss, color="#2471a3", marker=".", label="SSIM")
    ax2.set_ylabel("SSIM", color="#2471a3")
    ax2.ticklabel_format(axis="y", useOffset=False)
    ax.set_title(f"{m.pair.rec_a['clip']}: {m.pair.rec_a['prompt']}", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return seg


def _heatmap(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import colormaps

    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=2).astype(np.float64)
    top = max(float(diff.max()), 1.0)
    rgb = (colormaps["inferno"](diff / top)[..., :3] * 255).round().astype(np.uint8)
    return rgb, top


# -- HTML ----------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:3px 8px;
font-size:13px;text-align:left;vertical-align:top}th{background:#f3f3f3}
.pass{color:#fff;background:#1e8449;padding:4px 10px;border-radius:4px}
.fail{color:#fff;background:#c0392b;padding:4px 10px;border-radius:4px}
.none{color:#fff;background:#777;padding:4px 10px;border-radius:4px}
.diff{background:#fdebd0}.thumbs img{image-rendering:pixelated;width:192px;margin-right:6px}
.job{border-top:2px solid #ddd;padding-top:10px;margin-top:16px}code{font-size:12px}
"""


def _fmt(v) -> str:
    """A number in the HTML: 4 significant digits, &ndash; for None, &infin; for inf."""
    if v is None or isinstance(v, float):
        return fmt(v, 4, none="&ndash;", inf="&infin;")
    return html.escape(str(v))


def _html(summary: dict, measures, images: dict) -> str:
    e = html.escape
    gate = summary.get("gate")
    if gate is None:
        verdict = '<span class="none">no gate</span>'
    else:
        verdict = f'<span class="{gate["verdict"]}">{gate["verdict"].upper()}</span>'
    out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>evalkit compare: {e(str(summary['suite']['name']))}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>evalkit compare: suite {e(str(summary['suite']['name']))}</h1>",
           f"<p>Gate: {verdict} &nbsp; A = <code>{e(summary['runs']['a']['path'])}</code> "
           f"({e(str(summary['runs']['a']['backend'].get('spec')))}), B = "
           f"<code>{e(summary['runs']['b']['path'])}</code> "
           f"({e(str(summary['runs']['b']['backend'].get('spec')))}); metrics on "
           f"{e(summary['metrics_device'])}; {len(summary['jobs']['compared'])} jobs compared, "
           f"{len(summary['jobs']['not_compared'])} not.</p>"]
    if gate and gate["reasons"]:
        out.append("<ul>" + "".join(f"<li>{e(r)}</li>" for r in gate["reasons"]) + "</ul>")
    for w in summary.get("warnings", []):
        out.append(f"<p><b>Warning:</b> {e(w)}</p>")
    out.append("<h2>Summary</h2><table><tr><th>metric</th><th>mean</th><th>p95</th><th>worst</th>")
    floors = list(summary["floor_ratios"])
    out += [f"<th>mean / {e(f)} floor</th>" for f in floors]
    out.append("<th>unit</th></tr>")
    for k, agg in summary["aggregates"].items():
        out.append(f"<tr><td>{e(k)}</td><td>{_fmt(agg['mean'])}</td><td>{_fmt(agg['p95'])}</td>"
                   f"<td>{_fmt(agg['worst'])}</td>")
        out += [f"<td>{_fmt(summary['floor_ratios'][f].get(k, {}).get('mean'))}</td>" for f in floors]
        out.append(f"<td>{e(summary['units'].get(k, ''))}</td></tr>")
    out.append("</table>")
    if gate:
        out.append("<h2>Gate checks</h2><table><tr><th>check</th><th>result</th></tr>")
        out += [f"<tr><td>{e(c['text'])}</td><td>{'pass' if c['pass'] else 'FAIL'}</td></tr>"
                for c in gate["checks"]]
        out.append("</table>")
    if summary["floors"]:
        out.append("<h2>Noise floors</h2><table><tr><th>floor</th><th>run</th><th>backend</th>"
                   "<th>seed offset</th><th>LPIPS mean</th><th>jobs</th></tr>")
        for name, f in summary["floors"].items():
            out.append(f"<tr><td>{e(name)}</td><td><code>{e(f['run'])}</code></td>"
                       f"<td>{e(str(f['backend']))}</td><td>{f['seed_offset']}</td>"
                       f"<td>{_fmt(f['aggregates'].get('lpips', {}).get('mean'))}</td>"
                       f"<td>{f['jobs_compared']}</td></tr>")
        out.append("</table>")
    fa, fb = summary["runs"]["a"]["fingerprint"], summary["runs"]["b"]["fingerprint"]
    out.append("<h2>Environment fingerprints</h2><table><tr><th>key</th><th>A</th><th>B</th></tr>")
    for k in sorted(set(fa) | set(fb)):
        cls = " class='diff'" if fa.get(k) != fb.get(k) else ""
        out.append(f"<tr{cls}><td>{e(k)}</td><td>{e(str(fa.get(k)))}</td><td>{e(str(fb.get(k)))}</td></tr>")
    out.append("</table>")
    if summary["jobs"]["not_compared"]:
        out.append("<h2>Jobs not compared</h2><table><tr><th>job</th><th>why</th></tr>")
        out += [f"<tr><td><code>{e(j)}</code></td><td>{e(r)}</td></tr>"
                for j, r in summary["jobs"]["not_compared"].items()]
        out.append("</table>")
    out.append("<h2>Clips</h2>")
    for m in measures:
        img = images[m.pair.job_id]
        rec = m.pair.rec_a
        out.append(f"<div class='job'><h3>{e(rec['clip'])}: {e(rec['prompt'])} "
                   f"<small>(seed {rec.get('effective_seed', rec['seed'])}, <code>{e(m.pair.job_id)}</code>)</small></h3>")
        means = m.summary["means"]
        out.append(f"<p>LPIPS {_fmt(means.get('lpips'))}, SSIM {_fmt(means.get('ssim'))}, PSNR "
                   f"{_fmt(means.get('psnr'))} dB; worst frame {m.worst_frame}, worst segment "
                   f"frames {img['segment'][0]}&ndash;{img['segment'][1] - 1}"
                   f"{'; bit-identical' if m.summary['identical'] else ''}.</p>")
        out.append(f"<img src='{img['timeline']}' alt='LPIPS and SSIM per frame'>")
        if img.get("a"):
            out.append(f"<div class='thumbs'><img src='{img['a']}' alt='A, worst frame'>"
                       f"<img src='{img['b']}' alt='B, worst frame'>"
                       f"<img src='{img['heat']}' alt='difference heatmap'></div>"
                       f"<p><small>A, B and |A - B| (max over channels, 0 to {img['heat_max']:.0f} "
                       "in 8-bit units, inferno colour map) at the worst frame</small></p>")
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(out: Path, summary: dict, measures) -> None:
    from metrics.stream import json_safe

    out = Path(out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    write_frames_csv(out / "frames.csv", measures)
    jobs = {m.pair.job_id: m.pair.rec_a for m in measures}
    write_clips_csv(out / "clips.csv", measures, summary["jobs"]["not_compared"], jobs)
    images = {}
    for i, m in enumerate(measures):
        stem = f"img/job{i:04d}"
        entry = {"timeline": f"{stem}_timeline.png"}
        entry["segment"] = _timeline(out / entry["timeline"], m)
        if m.worst_a is not None and m.worst_b is not None:
            heat, top = _heatmap(m.worst_a, m.worst_b)
            for key, arr in (("a", m.worst_a), ("b", m.worst_b), ("heat", heat)):
                entry[key] = f"{stem}_{key}.png"
                _save_png(out / entry[key], arr)
            entry["heat_max"] = top
        images[m.pair.job_id] = entry
    summary["files"] = {"frames": "frames.csv", "clips": "clips.csv", "html": "index.html"}
    atomic_write_text(out / "summary.json", json.dumps(json_safe(summary), indent=2) + "\n")
    atomic_write_text(out / "index.html", _html(summary, measures, images))
