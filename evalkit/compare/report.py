"""Compare report writers: frames.csv, clips.csv, summary.json and an offline index.html.

Columns (units: ``summary.json["units"]``; README "Compare report"; the metric columns are
the keys of :mod:`evalkit.metrics.catalogue`, in its order):

- ``frames.csv``: job, clip, prompt, seed, frame, then one column per metric (empty where a
  metric is undefined, e.g. temporal metrics at frame 0; ``inf`` for the PSNR of identical frames;
  an optional metric such as ``vmaf`` only when it was computed: ``--vmaf``).
- ``clips.csv``: job, clip, prompt, seed, status (``compared`` or why not), frames,
  worst_frame (highest LPIPS), identical, offset (B's temporal offset in frames the job was
  compared at: +1 = B one frame late; :mod:`evalkit.compare.alignment`), alignment (its
  finding: aligned, shifted, static, short, given), then ``<metric>_mean``, ``<metric>_p95``,
  ``<metric>_worst`` per metric.
- ``index.html``: ``templates/report.html.j2`` rendered by Jinja2 with autoescaping on.

The report is written whole into a temporary folder next to ``--out`` and then takes its place
in one rename (:func:`evalkit.fsutil.atomic_dir`): a report folder is always a complete report,
the old one or the new one, never a mix; what a killed compare left is tidied on the next start.

Plots are drawn on :class:`matplotlib.figure.Figure` objects, never through ``pyplot``: writing a
report leaves the caller's matplotlib backend (a notebook's, say) as it was.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from evalkit.compare.aggregate import aggregate
from evalkit.errors import UserError
from evalkit.formats.models import SUMMARY_SCHEMA_VERSION  # noqa: F401  (summary.json's; compare writes it)
from evalkit.fsutil import atomic_dir, atomic_path, atomic_write_bytes, atomic_write_text, write_csv
from evalkit.metrics.catalogue import KEYS, METRICS, fmt


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


def metric_columns(measures) -> list[str]:
    """The metric columns of the report CSVs: every catalogue key, but an optional one (vmaf)
    only when some frame has it (it was asked for)."""
    return [k for k in KEYS if not METRICS[k].optional or any(k in r for m in measures for r in m.records)]


def write_frames_csv(path: Path, measures) -> None:
    cols = metric_columns(measures)

    def rows():
        for m in measures:
            for r in m.records:
                yield _job_cols(m.pair.rec_a) + [r["frame"]] + [r.get(k) for k in cols]

    _write_csv(path, ["job", "clip", "prompt", "seed", "frame", *cols], rows())


def write_clips_csv(path: Path, measures, not_compared: dict, jobs_by_id: dict) -> None:
    cols = metric_columns(measures)
    header = [
        "job",
        "clip",
        "prompt",
        "seed",
        "status",
        "frames",
        "worst_frame",
        "identical",
        "offset",
        "alignment",
    ]
    for k in cols:
        header += [f"{k}_mean", f"{k}_p95", f"{k}_worst"]
    rows = []
    for m in measures:
        al = m.alignment
        row = _job_cols(m.pair.rec_a) + [
            "compared",
            len(m.records),
            m.worst_frame,
            m.summary["identical"],
            al and al.offset,
            al and al.finding,
        ]
        for k in cols:
            agg = aggregate([r.get(k) for r in m.records], k)
            row += [agg["mean"], agg["p95"], agg["worst"]]
        rows.append(row)
    for jid, reason in not_compared.items():
        rec = jobs_by_id.get(jid, {"id": jid, "clip": "", "prompt": "", "seed": ""})
        rows.append(_job_cols(rec) + [reason, 0, None, None, None, None] + [None] * (3 * len(cols)))
    _write_csv(path, header, rows)


# -- the runs: names, fingerprints, notices -------------------------------------------------

#: summary.json's ``floor_notice`` (and the HTML's, and compare's output) when no floor run
#: had a job compared: the numbers stand without the context of a noise floor
FLOOR_NOTICE = (
    "no noise floor: these numbers cannot be read against how much the pipeline "
    "varies by itself (two seeds, or two renders, on one backend); render (or "
    "import) A's suite again with --seed-offset 1 and pass that run with --floor"
)


def fingerprint_source(manifest: dict) -> str:
    """Where a run's fingerprint comes from, in words (the first row of the report's table)."""
    adopted = manifest.get("adopted") or {}
    fp_file = adopted.get("fingerprint_file")
    if fp_file:
        return f"adopted from {fp_file.get('path')} (sha256 {str(fp_file.get('sha256'))[:12]})"
    if "unknown" in (manifest.get("fingerprint") or {}):
        return "unknown: renders adopted without --fingerprint"
    return "recorded by render on the machine that rendered"


def run_entry(run) -> dict:
    """``summary.json``'s ``runs.a``/``runs.b``: path, name (label, else backend spec), label,
    backend, fingerprint and where it comes from, renderer."""
    from evalkit.formats.run import run_name

    m = run.manifest
    return {
        "path": str(run.path),
        "name": run_name(m),
        "label": m.get("label"),
        "backend": m["backend"],
        "fingerprint": m["fingerprint"],
        "fingerprint_source": fingerprint_source(m),
        "renderer": m["renderer"],
    }


def same_run_warnings(ma: dict, mb: dict, differences: dict) -> list[str]:
    """A warning when both runs carry the same name (label and backend spec), saying truly what
    their differences can come from; none for runs of different names (two imports labelled
    after their machines, say)."""
    la, lb = ma.get("label"), mb.get("label")
    sa, sb = (ma.get("backend") or {}).get("spec"), (mb.get("backend") or {}).get("spec")
    if la != lb or sa != sb or (la is None and sa is None):
        return []
    name = (f"label {la!r}" + (f" (backend {sa!r})" if sa else "")) if la else f"backend {sa!r}"
    fa, fb = ma.get("fingerprint") or {}, mb.get("fingerprint") or {}
    if "unknown" in fa or "unknown" in fb:
        why = (
            "the machine of at least one is not known (adopted without --fingerprint), so "
            "whether they ran on the same one cannot be told"
        )
    elif differences:
        why = (
            "differences come only from the environment: "
            + ", ".join(differences)
            + " differ (fingerprint table)"
        )
    else:
        why = (
            "their fingerprints match apart from the host, so this measures how much one "
            "backend varies between two renders, not a backend change"
        )
    return [f"both runs are {name}; {why}"]


def floor_notice(floors: dict) -> str | None:
    """:data:`FLOOR_NOTICE` unless a floor run had at least one job compared."""
    return None if any(f.get("jobs_compared") for f in floors.values()) else FLOOR_NOTICE


# -- images --------------------------------------------------------------------------------

#: zlib level of the report's PNGs: 1 writes a 720p frame 3.4x faster than PIL's default 6,
#: for files about 20% larger
PNG_COMPRESS_LEVEL = 1


def _png_bytes(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def _save_png(path: Path, rgb: np.ndarray) -> None:
    atomic_write_bytes(path, _png_bytes(rgb))


def report_threads() -> int:
    """Threads that encode a report's PNGs."""
    return max(1, min(8, os.cpu_count() or 1))


def _worst_png_bytes(a: np.ndarray, b: np.ndarray) -> tuple[dict[str, bytes], float]:
    """A job's worst frame pair and their difference heat map encoded as PNG (``a``, ``b``,
    ``heat`` -> bytes); the map's top value."""
    heat, top = _heatmap(a, b)
    return {key: _png_bytes(arr) for key, arr in (("a", a), ("b", b), ("heat", heat))}, top


def _worst_pngs(out: Path, stem: str, a: np.ndarray, b: np.ndarray, made=None) -> float:
    """A job's worst frame pair and their difference heat map as PNGs; the map's top value.
    ``made``: a future of :func:`_worst_png_bytes` already started (:class:`ReportParts`)."""
    pngs, top = made.result() if made is not None else _worst_png_bytes(a, b)
    for key, data in pngs.items():
        atomic_write_bytes(out / f"{stem}_{key}.png", data)
    return top


def _load_plotting() -> None:
    """What the first plot would load: matplotlib's figure and colour maps, the font's glyphs."""
    from matplotlib import colormaps  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401

    plot_text("")


class ReportParts:
    """The parts of a report that depend on one job alone, made while later jobs are measured:
    each job's worst-frame PNGs (:meth:`add`, called as the job's measure is complete: encoded
    into memory on threads; zlib lets go of the interpreter lock), and matplotlib loaded
    meanwhile. :func:`write_report` writes what is made and makes what is not (the same bytes
    either way); the timelines wait for the summary's shared axes (every clip and floor)."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=report_threads(), thread_name_prefix="evalkit-report")
        self._pngs: dict[int, tuple] = {}  # id(measure) -> (measure, future of _worst_png_bytes)
        self._loading = None

    def add(self, m) -> None:
        """Start encoding ``m``'s worst frames (a :class:`evalkit.compare.pairing.JobMeasure`);
        at the first job, loading matplotlib too (not sooner: the session's start, ``import
        torch``, holds the interpreter lock)."""
        if self._loading is None:
            self._loading = self.pool.submit(_load_plotting)
        if m.worst_a is not None and m.worst_b is not None and id(m) not in self._pngs:
            self._pngs[id(m)] = (m, self.pool.submit(_worst_png_bytes, m.worst_a, m.worst_b))

    def pngs_of(self, m):
        """The future of ``m``'s PNGs, None if not started."""
        got = self._pngs.get(id(m))
        return got[1] if got is not None and got[0] is m else None

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def worst_segment(values: list[float], width: int) -> tuple[int, int]:
    """[start, end) of the window of ``width`` frames with the highest mean."""
    arr = np.asarray(values, dtype=np.float64)
    if len(arr) <= width:
        return 0, len(arr)
    sums = np.convolve(arr, np.ones(width), mode="valid")
    start = int(np.argmax(sums))
    return start, start + width


def segment_of(m, lpips: list[float]) -> tuple[int, int]:
    """[start, end) in A's frame numbers of a job's worst segment: its local burst when one
    stands out (:mod:`evalkit.compare.local`: exactly the frames of a glitch), else the window
    of up to 8 frames with the highest mean LPIPS."""
    local = getattr(m, "local", None)
    if local and not local["throughout"]:
        return local["burst"][0], local["burst"][1] + 1
    start, end = worst_segment(lpips, max(1, min(8, len(lpips) // 4)))
    first = m.records[0]["frame"] if m.records else 0
    return start + first, end + first


_GLYPHS: set[int] | None = None


def plot_text(text: str, limit: int = 90) -> str:
    """``text`` as the plot's font can draw it: characters it has no glyph for (a CJK or
    Devanagari prompt with matplotlib's DejaVu Sans) become ``?`` and the title says where the
    whole text is (the HTML report and clips.csv show it as it is), instead of empty boxes and
    a warning per glyph; cut to ``limit`` characters."""
    global _GLYPHS
    if _GLYPHS is None:
        from matplotlib import font_manager, ft2font

        path = font_manager.findfont(font_manager.FontProperties())  # the default font
        _GLYPHS = set(ft2font.FT2Font(path).get_charmap())
    shown = "".join(c if ord(c) in _GLYPHS or c in "\n\t" else "?" for c in text)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return shown if shown == text else shown + " (full text: report page, clips.csv)"


#: colour of the human threshold's line on the LPIPS plots (and of its gate bound, dotted)
THRESHOLD_COLOR = "#7d3c98"

#: the floor band's colour on the LPIPS plots
FLOOR_COLOR = "#7f8c8d"


def _finite_values(measures, key: str) -> list[float]:
    return [
        float(r[key])
        for m in measures
        for r in m.records
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]


def plot_axes(measures, floor_jobs: dict, findings: list) -> dict:
    """summary.json's ``plots`` (issue 46 item 6): the axes every clip's plot shares, so that
    clips compare at a glance (an autoscaled plot of +-1 LSB noise looks like crf 32), and each
    clip's floor band: its floor job's LPIPS mean and p95 (the floor its finding is read
    against, :func:`evalkit.compare.aggregate.clip_finding`). ``lpips``: [0, top], top above
    every clip's and floor band's worst; ``ssim``: [lowest, 1]; ``frames``: [first, last]."""
    pick = {f["clip"]: f.get("floor") for f in findings}
    bands = {}
    for m in measures:
        jid = m.pair.job_id
        name = pick.get(jid) or next((n for n, per in floor_jobs.items() if jid in per), None)
        agg = ((floor_jobs.get(name) or {}).get(jid) or {}).get("lpips") or {}
        if agg.get("p95") is not None and math.isfinite(agg["p95"]):
            bands[jid] = {"floor": name, "mean": agg["mean"], "p95": agg["p95"]}
    lp = _finite_values(measures, "lpips") + [b["p95"] for b in bands.values()]
    ss = _finite_values(measures, "ssim")
    frames = [r["frame"] for m in measures for r in m.records]
    top = max(lp, default=0.0)
    top = top * 1.08 if top > 0 else 1e-3
    lo = min(ss, default=1.0)
    lo = lo - max(1.0 - lo, 1e-6) * 0.08
    return {
        "lpips": [0.0, top],
        "ssim": [lo, 1.0 + max(1.0 - lo, 1e-6) * 0.02],
        "frames": [min(frames, default=0), max(frames, default=0)],
        "floor_bands": bands,
    }


def _timeline(path: Path, m, human: dict | None = None, axes: dict | None = None) -> tuple[int, int]:
    """The per-frame LPIPS (and SSIM) plot of one job; with ``human`` (a gate's
    ``human_threshold`` block in LPIPS), the human detection threshold as a dashed horizontal
    line and the gate's bound (threshold / safety factor) as a dotted one. ``axes``:
    summary.json's ``plots`` (:func:`plot_axes`): every clip's plot on the same axes, the
    clip's floor band (0 to the floor job's LPIPS p95) shaded grey, its mean dashed."""
    from matplotlib.figure import Figure

    frames = [r["frame"] for r in m.records]
    lp = [r["lpips"] for r in m.records]
    ss = [r["ssim"] for r in m.records]
    seg = segment_of(m, lp)
    fig = Figure(figsize=(7, 2.4), dpi=100)
    ax = fig.subplots()
    band = ((axes or {}).get("floor_bands") or {}).get(m.pair.job_id)
    if band is not None:
        ax.axhspan(
            0.0,
            band["p95"],
            color=FLOOR_COLOR,
            alpha=0.25,
            linewidth=0,
            label=f"{band['floor']} floor (to p95)",
        )
        ax.axhline(band["mean"], color=FLOOR_COLOR, linestyle="--", linewidth=1)
    ax.plot(frames, lp, color="#c0392b", marker=".", label="LPIPS")
    ax.set_xlabel("frame")
    ax.set_ylabel("LPIPS", color="#c0392b")
    ax.axvspan(seg[0] - 0.5, seg[1] - 0.5, color="#f5b7b1", alpha=0.5, label="worst segment")
    if axes is not None:
        ax.set_ylim(*axes["lpips"])
        ax.set_xlim(axes["frames"][0] - 0.5, axes["frames"][1] + 0.5)
    if band is not None:
        ax.text(
            0.005,
            band["p95"],
            plot_text(f"{band['floor']} floor", 40),
            transform=ax.get_yaxis_transform(),
            ha="left",
            va="bottom",
            fontsize=7,
            color="#555",
            parse_math=False,
        )
    if human is not None and human.get("metric") == "lpips":
        value = float(human["value"])
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.0), max(hi, value * 1.15))  # the line is always in view
        ax.axhline(value, color=THRESHOLD_COLOR, linestyle="--", linewidth=1.5, label="human threshold")
        ax.axhline(
            value / float(human["safety_factor"]),
            color=THRESHOLD_COLOR,
            linestyle=":",
            linewidth=1.2,
            label="gate bound",
        )
        ax.text(
            0.995,
            value,
            plot_text(
                f"human threshold ({'>= ' if human.get('bound') else ''}{value:.3g}, study {human['study']})",
                60,
            ),
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="bottom",
            fontsize=7,
            color=THRESHOLD_COLOR,
            parse_math=False,
        )
    ax2 = ax.twinx()
    ax2.plot(frames, ss, color="#2471a3", marker=".", label="SSIM")
    ax2.set_ylabel("SSIM", color="#2471a3")
    if axes is not None:
        ax2.set_ylim(*axes["ssim"])
    ax2.ticklabel_format(axis="y", useOffset=False)
    # the clip id and prompt are text, not mathtext: "$$" or "$\foo{" in a prompt is printed
    ax.set_title(plot_text(f"{m.pair.rec_a['clip']}: {m.pair.rec_a['prompt']}"), fontsize=9, parse_math=False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return seg


def shared_axes(plots: dict | None, human: dict | None) -> dict | None:
    """summary.json's ``plots`` with the LPIPS axis raised to show a gate's human threshold
    on every plot (None: each plot autoscaled, for summaries made before ``plots``)."""
    if not plots:
        return None
    axes = dict(plots)
    if human is not None and human.get("metric") == "lpips":
        axes["lpips"] = [axes["lpips"][0], max(axes["lpips"][1], float(human["value"]) * 1.15)]
    return axes


def _heatmap(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    from matplotlib import colormaps

    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=2).astype(np.float64)
    top = max(float(diff.max()), 1.0)
    rgb = (colormaps["inferno"](diff / top)[..., :3] * 255).round().astype(np.uint8)
    return rgb, top


# -- HTML ----------------------------------------------------------------------------------


def _num(v):
    """A number in the HTML: 4 significant digits, &ndash; for None, &infin; for inf (markup,
    from digits and those two entities only); anything else as text, escaped by the template."""
    from markupsafe import Markup

    if v is None or isinstance(v, float):
        return Markup(fmt(v, 4, none="&ndash;", inf="&infin;"))
    return str(v)


@functools.lru_cache(maxsize=None)
def _template():
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("evalkit.compare", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    return env.get_template("report.html.j2")


def render_html(summary: dict, measures, images: dict) -> str:
    """index.html: the summary, gate, floors, fingerprints and one section per compared job
    (``images``: job id -> the job's image paths, relative to the report folder)."""
    ra, rb = summary["runs"]["a"], summary["runs"]["b"]
    fa, fb = ra["fingerprint"], rb["fingerprint"]
    fingerprints = [("source", ra.get("fingerprint_source", ""), rb.get("fingerprint_source", ""), False)]
    fingerprints += [
        (k, str(fa.get(k)), str(fb.get(k)), fa.get(k) != fb.get(k)) for k in sorted(set(fa) | set(fb))
    ]
    findings = {f["clip"]: f for f in summary.get("clip_findings") or []}
    clips = [
        {
            "rec": m.pair.rec_a,
            "job": m.pair.job_id,
            "img": images[m.pair.job_id],
            "seed": m.pair.rec_a.get("effective_seed", m.pair.rec_a["seed"]),
            "means": m.summary["means"],
            "worst_frame": m.worst_frame,
            "identical": m.summary["identical"],
            "offset": (summary.get("alignment") or {}).get("jobs", {}).get(m.pair.job_id),
            "finding": findings.get(m.pair.job_id),
        }
        for m in measures
    ]
    rank = {f["clip"]: i for i, f in enumerate(summary.get("clip_findings") or [])}
    clips.sort(key=lambda c: rank.get(c["job"], len(rank)))
    return _template().render(
        summary=summary, gate=summary.get("gate"), fingerprints=fingerprints, clips=clips
    )


#: what a report folder holds; a folder with anything else is not replaced by a report
REPORT_ENTRIES = ("frames.csv", "clips.csv", "summary.json", "index.html", "img")


def check_report_folder(out: Path) -> None:
    """``--out`` is replaced whole, so it must be absent, empty or a report (``.tmp-*`` files
    that an older evalkit's killed compare left are allowed: they go with the old report)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder (--out)")
    if out.is_dir():
        for p in sorted(out.iterdir()):
            if p.name not in REPORT_ENTRIES and not p.name.startswith(".tmp-"):
                raise UserError(
                    f"{out}: holds {p.name!r}, which is not part of a compare report "
                    "(a report folder is replaced whole); choose another --out folder"
                )


def write_report(out: Path, summary: dict, measures, parts: ReportParts | None = None) -> None:
    """Write the report into a temporary folder next to ``out``, then put it in ``out``'s
    place in one rename (the old report, if any, stays complete until then). ``parts``: what
    was made while the jobs were measured (:class:`ReportParts`)."""
    out = Path(out)
    check_report_folder(out)
    with atomic_dir(out) as tmp:
        _write_report_files(tmp, summary, measures, parts)


def _write_report_files(out: Path, summary: dict, measures, parts: ReportParts | None = None) -> None:
    from evalkit.metrics.stream import json_safe

    (out / "img").mkdir(parents=True, exist_ok=True)
    write_frames_csv(out / "frames.csv", measures)
    jobs = {m.pair.job_id: m.pair.rec_a for m in measures}
    write_clips_csv(out / "clips.csv", measures, summary["jobs"]["not_compared"], jobs)
    images = {}
    human = (summary.get("gate") or {}).get("human_threshold")
    axes = shared_axes(summary.get("plots"), human)
    # The worst frames' PNGs (zlib lets go of the GIL) are encoded on threads while the
    # timelines (matplotlib, GIL-bound) are drawn here.
    with ThreadPoolExecutor(max_workers=report_threads(), thread_name_prefix="evalkit-png") as pool:
        pending = []
        for i, m in enumerate(measures):
            stem = f"img/job{i:04d}"
            entry = {"timeline": f"{stem}_timeline.png"}
            if m.worst_a is not None and m.worst_b is not None:
                for key in ("a", "b", "heat"):
                    entry[key] = f"{stem}_{key}.png"
                made = parts.pngs_of(m) if parts is not None else None
                pending.append((entry, pool.submit(_worst_pngs, out, stem, m.worst_a, m.worst_b, made)))
            images[m.pair.job_id] = entry
        for i, m in enumerate(measures):
            entry = images[m.pair.job_id]
            entry["segment"] = _timeline(out / entry["timeline"], m, human, axes)
        for entry, fut in pending:
            entry["heat_max"] = fut.result()
    summary["files"] = {"frames": "frames.csv", "clips": "clips.csv", "html": "index.html"}
    atomic_write_text(out / "summary.json", json.dumps(json_safe(summary), indent=2) + "\n")
    atomic_write_text(out / "index.html", render_html(summary, measures, images))
