"""The admin page (Gradio, mounted at /admin behind a password): studies with live counts,
results and verdict with a per-clip plot, each clip's accuracy against its LPIPS, a threshold
study's psychometric curve, rater quality and exclusions, invites, CSV export.
Every figure comes from :mod:`evalkit.study` (``results``, ``ratings_csv``, ``summary_csv``,
``invite``); this module only lays them out."""

from __future__ import annotations

import html
import os
import re

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.errors import UserError  # noqa: E402
from evalkit.study import protocols  # noqa: E402
from evalkit.study.text import results_lines  # noqa: E402

STUDY_COLUMNS = ["study", "protocol", "clips", "raters", "raters_planned", "ratings", "trials", "created"]


def studies_table(db) -> pd.DataFrame:
    """One row per study with live counts (:func:`evalkit.study.list_studies`)."""
    return pd.DataFrame(study.list_studies(db), columns=STUDY_COLUMNS)


def plain(text: str) -> str:
    """``text`` shown as written inside Markdown: HTML's special characters as entities, and
    the Markdown that fetches or runs something (links, images, code, LaTeX) escaped. Free text
    (``unblind --who/--reason``, labels) reaches the page through here, never as markup."""
    text = html.escape(str(text), quote=False)
    return re.sub(r"([\\`\[\]$!|])", r"\\\1", text)


def verdict_markdown(res: dict) -> str:
    """The study's results as the CLI prints them (one formatter: evalkit.study.text)."""
    lines = [plain(ln) for ln in results_lines(res)]
    return f"### {lines[0]}\n\n" + "\n\n".join(lines[1:])


def study_id(sid) -> int:
    """The admin page's study number: a whole number from 1 (a UserError in one line for
    anything else the page or a script sends: text, NaN, infinity, a list)."""
    if isinstance(sid, bool) or not isinstance(sid, (int, float, str)) or sid in ("", None):
        raise UserError(f"study: expected a study number, found {str(sid)[:40]!r}")
    try:
        f = float(sid)
        n = int(f)
    except (ValueError, OverflowError):
        raise UserError(f"study: expected a study number, found {str(sid)[:40]!r}") from None
    if n != f or not 1 <= n <= 2**63 - 1:
        raise UserError(f"study: expected a whole study number from 1, found {str(sid)[:40]!r}")
    return n


def clip_plot(res: dict):
    """Per-clip accuracy (ABX) or B's win rate (preference); flagged clips in red. None while
    the study is interim (a per-clip figure would show where the verdict is heading)."""
    if res["status"] != "complete" or not res.get("per_clip"):
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    pc = res["per_clip"]
    key = _accuracy_key(res)
    vals = [c[key] if c.get(key) is not None else 0 for c in pc]
    ax.bar(range(len(pc)), vals, color=["#c0392b" if c.get("flagged") else "#4a78b0" for c in pc])
    ax.axhline(0.5, color="k", lw=1)
    ax.set_xticks(range(len(pc)))
    ax.set_xticklabels([tick_label(c["job"]) for c in pc], rotation=45, ha="right", fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel(key)
    ax.set_title(protocols.get(res["protocol"]).per_clip_title(key))
    return fig


def tick_label(job: str, limit: int = 16) -> str:
    """A job id short enough that neighbouring labels do not overlap (the table has it whole)."""
    job = str(job)
    return job if len(job) <= limit else job[: limit - 1] + "…"


def _accuracy_key(res: dict) -> str:
    return protocols.get(res["protocol"]).per_clip_key


def lpips_plot(res: dict):
    """Each clip's accuracy (ABX, threshold: each clip at each level) or B's win rate
    (preference) against its LPIPS (the report's, or the stimulus's), log scale. None while
    the study is interim or without LPIPS."""
    if res["status"] != "complete":
        return None
    key = _accuracy_key(res)
    if protocols.get(res["protocol"]).by_level:
        pts = [
            (p["lpips"], p["accuracy"], p["n"], f"{p['job']} x{p['level']:g}")
            for p in res.get("levels") or []
        ]
    else:
        pts = [
            (c.get("lpips_mean"), c.get(key), c.get("ratings"), str(c["job"]))
            for c in res.get("per_clip") or []
        ]
    pts = [p for p in pts if p[0] is not None and p[0] > 0 and p[1] is not None]
    if not pts:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    ax.scatter(
        [p[0] for p in pts],
        [p[1] for p in pts],
        s=[12 + 4 * (p[2] or 0) for p in pts],
        color="#4a78b0",
        alpha=0.7,
    )
    for x, y, n, label in pts:
        ax.annotate(tick_label(label), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.axhline(0.5, color="k", lw=1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("LPIPS against A (mean over frames)")
    ax.set_ylabel(key)
    ax.set_title(f"per clip {key} against LPIPS (marker size: ratings)")
    return fig


def curve_plot(res: dict):
    """A threshold study's psychometric curve: the pooled points (proportion correct, with
    their n), the fitted curve, the threshold with its interval and the real backend
    difference (k = 1) marked. None unless a complete threshold study."""
    if not protocols.get(res["protocol"]).by_level or res["status"] != "complete":
        return None
    a = res.get("threshold") or {}
    pooled = a.get("pooled") or {}
    pts = [p for p in pooled.get("points") or [] if p.get("x") and p.get("n")]
    if not pts:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    xs = [p["x"] for p in pts]
    ys = [p["correct"] / p["n"] for p in pts]
    ax.scatter(
        xs, ys, s=[12 + 3 * p["n"] for p in pts], color="#4a78b0", zorder=3, label="pooled points (size: n)"
    )
    for p, y in zip(pts, ys):
        ax.annotate(f"n={p['n']}", (p["x"], y), fontsize=7, xytext=(4, -10), textcoords="offset points")
    curve = pooled.get("curve") or []
    if curve:
        ax.plot(
            [c[0] for c in curve],
            [c[1] for c in curve],
            color="#2c3e50",
            lw=1.5,
            label=f"fit ({a.get('model', '')})",
        )
    thr = pooled.get("threshold")
    crit = a.get("criterion", 0.75)
    if thr is not None:
        lo, hi = (pooled.get("ci") or [None, None])[:2]
        if lo is not None and hi is not None:
            ax.axvspan(lo, hi, color="#f39c12", alpha=0.2, label="threshold interval")
        ax.axvline(thr, color="#e67e22", lw=1.5, label=f"threshold {thr:.3g} ({crit:g} correct)")
    ref = a.get("reference")
    if ref:
        ax.axvline(ref, color="#c0392b", ls="--", lw=1.5, label=f"real backend difference {ref:.3g}")
    ax.axhline(0.5, color="k", lw=0.8)
    ax.axhline(crit, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_ylim(0.3, 1.05)
    ax.set_xlabel(f"{a.get('metric', 'lpips')} of the stimulus against A")
    ax.set_ylabel("proportion correct (ABX)")
    ax.set_title("psychometric curve (pooled over clips and raters)")
    ax.legend(fontsize=6, loc="lower right")
    return fig


# -- progress until the verdict (evalkit.study.study_progress lays down every figure) -----------


def progress_markdown(prog: dict) -> str:
    """The study's progress in one line, headed; shown above the per-rater table."""
    return f"#### Progress\n\n{plain(prog['text'])}"


def progress_table(prog: dict) -> pd.DataFrame:
    """One row per invited rater: answered of their trials, percentage done, state (named
    columns: never an empty frame headed 1 2 3)."""
    return pd.DataFrame(prog["raters"], columns=list(study.export.PROGRESS_COLUMNS)).rename(
        columns={"done": "done %"}
    )


def shown(value, ok: bool):
    """A component's new value, and hidden when there is nothing to show (an empty plot box or
    an empty table says nothing)."""
    return gr.update(value=value, visible=bool(ok))


def export_links(sid: int) -> str:
    """The two download links of a study's CSVs: ``/export``, which wants the admin password
    or this page's login session (never Gradio's file route, and no copy on disk)."""
    return (
        f'<a id="raw-csv" href="/export/{sid}/ratings.csv" download>Download raw ratings '
        f'CSV</a> &nbsp; <a id="summary-csv" href="/export/{sid}/summary.csv" download>'
        "Download summary CSV</a>"
    )


def _count(count) -> int:
    try:
        return int(float(count))
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"count: expected a number of raters, found {str(count)[:40]!r}") from None


def raw_number(**kw) -> gr.Number:
    """A number box whose value reaches the event as the page (or a script calling the event)
    sent it: :func:`study_id` checks it. (Gradio's own conversion raises on text or NaN: a 500
    with a traceback. A subclass would make Gradio write a .pyi beside this file.)"""
    box = gr.Number(**kw)
    box.preprocess = lambda payload: payload
    return box


def build_admin(db) -> gr.Blocks:
    def refresh():
        return studies_table(db)

    def show(sid):
        try:
            sid = study_id(sid)
            res = study.results(db, sid, reps=1000)
            prog = study.study_progress(db, sid)
        except UserError as e:
            return (
                f"**error:** {plain(e)}",
                shown("", False),
                shown(None, False),
                *(shown(None, False) for _ in range(3)),
                shown(None, False),
                shown(None, False),
            )
        clips = pd.DataFrame(
            res.get("levels")
            if protocols.get(res["protocol"]).by_level and res["status"] == "complete"
            else res.get("per_clip") or []
        )
        excl = pd.DataFrame(
            res["excluded_raters"],
            columns=["rater", "catch_trials", "catch_correct", "catch_needed", "reason"],
        )
        figs = [curve_plot(res), clip_plot(res), lpips_plot(res)]
        interim = res["status"] != "complete"
        return (
            verdict_markdown(res),
            shown(progress_markdown(prog), True),
            shown(progress_table(prog), bool(prog["raters"])),
            *(shown(f, f is not None) for f in figs),
            shown(clips, not interim and len(clips)),
            shown(excl, len(excl)),
        )

    def make_invites(sid, count, label, request: gr.Request):
        try:
            made = study.invite(db, study_id(sid), _count(count), label or None)
        except UserError as e:
            return f"error: {e}"
        host = request.headers.get("host", "127.0.0.1") if request else "127.0.0.1"
        return "\n".join(f"rater {m['rater']}: http://{host}/?token={m['token']}" for m in made)

    def export(sid):
        """Check the study and show the links to its two CSVs (made when downloaded)."""
        try:
            sid = study_id(sid)
            n = len(study.ratings_csv(db, sid).splitlines()) - 1
        except UserError as e:
            return f"**error:** {plain(e)}", ""
        return (
            f"Study {sid}: {n} rating{'s' if n != 1 else ''} to export (the key: "
            f"{study.key_status(db, sid)}).",
            export_links(sid),
        )

    with gr.Blocks(title="evalkit study admin", analytics_enabled=False) as demo:
        gr.Markdown("## evalkit study admin")
        with gr.Row():
            refresh_btn = gr.Button("Refresh", scale=0)
        table = gr.Dataframe(
            value=refresh, label="Studies (live counts)", interactive=False, elem_id="studies"
        )
        gr.Timer(5).tick(refresh, outputs=table)
        refresh_btn.click(refresh, outputs=table)
        sid = raw_number(label="Study", value=1, precision=0, elem_id="study-id")
        with gr.Tab("Results"):
            res_btn = gr.Button("Show results", elem_id="show-results")
            verdict = gr.Markdown(elem_id="verdict")
            prog_md = gr.Markdown(elem_id="progress", visible=False)
            prog_tab = gr.Dataframe(
                label="Raters (answered of their trials)",
                interactive=False,
                elem_id="rater-progress",
                visible=False,
            )
            curve = gr.Plot(label="Psychometric curve (threshold studies)", elem_id="curve", visible=False)
            plot = gr.Plot(label="Per clip", elem_id="clip-plot", visible=False)
            lp_plot = gr.Plot(label="Accuracy against LPIPS", elem_id="lpips-plot", visible=False)
            per_clip = gr.Dataframe(label="Per clip", interactive=False, elem_id="per-clip", visible=False)
            excluded = gr.Dataframe(
                label="Excluded raters (catch trials)", interactive=False, elem_id="excluded", visible=False
            )
            res_btn.click(
                show,
                inputs=sid,
                outputs=[verdict, prog_md, prog_tab, curve, plot, lp_plot, per_clip, excluded],
            )
        with gr.Tab("Invites"):
            count = raw_number(label="How many raters", value=1, precision=0)
            label = gr.Textbox(label="Label (optional)")
            inv_btn = gr.Button("Create invites", elem_id="make-invites")
            links = gr.Textbox(label="Invite links (shown only now)", lines=4, elem_id="links")
            inv_btn.click(make_invites, inputs=[sid, count, label], outputs=links)
        with gr.Tab("Export"):
            exp_btn = gr.Button("Export CSV", elem_id="export")
            exp_note = gr.Markdown(elem_id="export-note")
            dl_links = gr.HTML(elem_id="export-links")
            exp_btn.click(export, inputs=sid, outputs=[exp_note, dl_links])
    return demo
