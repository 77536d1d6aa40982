"""The admin page (Gradio, mounted at /admin behind a password): studies with live counts,
results and verdict with a per-clip plot, rater quality and exclusions, invites, CSV export.
Every figure comes from :mod:`evalkit.study` (``results``, ``ratings_csv``, ``summary_csv``,
``invite``); this module only lays them out."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.errors import UserError  # noqa: E402
from evalkit.study.text import results_lines  # noqa: E402

STUDY_COLUMNS = ["study", "protocol", "clips", "raters", "raters_planned", "ratings", "trials",
                 "created"]


def studies_table(db) -> pd.DataFrame:
    """One row per study with live counts (:func:`evalkit.study.list_studies`)."""
    return pd.DataFrame(study.list_studies(db), columns=STUDY_COLUMNS)


def verdict_markdown(res: dict) -> str:
    """The study's results as the CLI prints them (one formatter: evalkit.study.text)."""
    lines = results_lines(res)
    return f"### {lines[0]}\n\n" + "\n\n".join(lines[1:])


def clip_plot(res: dict):
    """Per-clip accuracy (ABX) or B's win rate (preference); flagged clips in red. None while
    the study is interim (a per-clip figure would show where the verdict is heading)."""
    if res["status"] != "complete" or not res.get("per_clip"):
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3))
    ax = fig.subplots()
    pc = res["per_clip"]
    key = "accuracy" if res["protocol"] == "abx" else "win_rate_b"
    vals = [c[key] if c.get(key) is not None else 0 for c in pc]
    ax.bar(range(len(pc)), vals, color=["#c0392b" if c.get("flagged") else "#4a78b0" for c in pc])
    ax.axhline(0.5, color="k", lw=1)
    ax.set_xticks(range(len(pc)))
    ax.set_xticklabels([str(c["job"]) for c in pc], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel(key)
    ax.set_title(f"per clip {key} (red: detectably different, Holm-adjusted)"
                 if res["protocol"] == "abx" else f"per clip {key}")
    fig.tight_layout()
    return fig


def export_root() -> Path:
    """This process's folder for CSV exports, ``<tmp>/evalkit-admin-<uid>-<pid>``: made on the
    first export, removed when the process exits; folders of processes no longer alive (a
    killed server) are removed here, so none pile up."""
    base = Path(tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for old in base.glob(f"evalkit-admin-{uid}-*"):
        pid = old.name.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return base / f"evalkit-admin-{uid}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_admin(db) -> gr.Blocks:
    out_dir = export_root()
    # a folder under our own pid can only be a killed earlier server's (a container's pid 1)
    shutil.rmtree(out_dir, ignore_errors=True)
    atexit.register(shutil.rmtree, out_dir, True)

    def refresh():
        return studies_table(db)

    def show(sid):
        try:
            res = study.results(db, int(sid or 0), reps=1000)
        except (UserError, ValueError) as e:
            return (f"**error:** {e}",
                    None, pd.DataFrame(), pd.DataFrame())
        clips = pd.DataFrame(res.get("per_clip") or [])
        excl = pd.DataFrame(res["excluded_raters"],
                            columns=["rater", "catch_trials", "catch_correct", "catch_needed",
                                     "reason"])
        return verdict_markdown(res), clip_plot(res), clips, excl

    def make_invites(sid, count, label, request: gr.Request):
        try:
            made = study.invite(db, int(sid or 0), int(count or 0), label or None)
        except (UserError, ValueError) as e:
            return f"error: {e}"
        host = request.headers.get("host", "127.0.0.1") if request else "127.0.0.1"
        return "\n".join(f"rater {m['rater']}: http://{host}/?token={m['token']}" for m in made)

    def export(sid):
        """Write both CSVs of the study; the two download buttons then serve them."""
        hidden = gr.DownloadButton(value=None, visible=False)
        try:
            sid = int(sid or 0)
            raw = study.ratings_csv(db, sid)
            summ = study.summary_csv(study.results(db, sid, reps=1000))
        except (UserError, ValueError) as e:
            return f"**error:** {e}", hidden, hidden
        # a fresh folder per export: the file names stay readable, and an older export's
        # files are never overwritten while a download may still be reading them
        out_dir.mkdir(mode=0o700, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f"study{sid}-", dir=out_dir))
        a, b = folder / f"study{sid}-ratings.csv", folder / f"study{sid}-summary.csv"
        a.write_text(raw)
        b.write_text(summ)
        n = len(raw.splitlines()) - 1
        return (f"Study {sid}: {n} rating{'s' if n != 1 else ''} exported.",
                gr.DownloadButton(value=str(a), visible=True),
                gr.DownloadButton(value=str(b), visible=True))

    with gr.Blocks(title="evalkit study admin", analytics_enabled=False) as demo:
        gr.Markdown("## evalkit study admin")
        with gr.Row():
            refresh_btn = gr.Button("Refresh", scale=0)
        table = gr.Dataframe(value=refresh, label="Studies (live counts)", interactive=False,
                             elem_id="studies")
        gr.Timer(5).tick(refresh, outputs=table)
        refresh_btn.click(refresh, outputs=table)
        sid = gr.Number(label="Study", value=1, precision=0, elem_id="study-id")
        with gr.Tab("Results"):
            res_btn = gr.Button("Show results", elem_id="show-results")
            verdict = gr.Markdown(elem_id="verdict")
            plot = gr.Plot(label="Per clip")
            per_clip = gr.Dataframe(label="Per clip", interactive=False, elem_id="per-clip")
            excluded = gr.Dataframe(label="Excluded raters (catch trials)", interactive=False,
                                    elem_id="excluded")
            res_btn.click(show, inputs=sid, outputs=[verdict, plot, per_clip, excluded])
        with gr.Tab("Invites"):
            count = gr.Number(label="How many raters", value=1, precision=0)
            label = gr.Textbox(label="Label (optional)")
            inv_btn = gr.Button("Create invites", elem_id="make-invites")
            links = gr.Textbox(label="Invite links (shown only now)", lines=4, elem_id="links")
            inv_btn.click(make_invites, inputs=[sid, count, label], outputs=links)
        with gr.Tab("Export"):
            exp_btn = gr.Button("Export CSV", elem_id="export")
            exp_note = gr.Markdown(elem_id="export-note")
            with gr.Row():
                raw_file = gr.DownloadButton("Download raw ratings CSV", visible=False,
                                             elem_id="raw-csv")
                sum_file = gr.DownloadButton("Download summary CSV", visible=False,
                                             elem_id="summary-csv")
            exp_btn.click(export, inputs=sid, outputs=[exp_note, raw_file, sum_file])
    return demo
