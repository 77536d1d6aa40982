"""The rater page: a Gradio Blocks app whose one component is the synced player, a ``gr.HTML``
(``app/static/player.{html,css,js}`` as its html_template, css_template and js_on_load).

Thin layer: loading the page and answering are two Gradio events, each one call of the study
service (:class:`evalkit.study.live.RaterService`, the one rater path); the player's value is
the service's reply. The token comes from the page's own URL (``/?token=T``), which Gradio
passes with every event (``gr.Request.query_params``).

The value the player gets (never anything that names a backend, run or job):
  {"progress", "trial", ["completion_code"], ["notice"]}  the service's view of the rater;
                                         ``notice`` when an answer came from a stale tab
  {"error", ["wait_ms"]}                 an answer refused; the trial stays on screen
  {"fatal"}                              no valid token: nothing to show
each with the ``nonce`` of the answer it replies to (so two equal replies still re-render).

To change the page (a confidence slider, another question), add Gradio components here and
pass them as inputs of the ``answer`` event; the service stores what it is given.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.errors import UserError  # noqa: E402
from evalkit.fsutil import storage_error  # noqa: E402
from evalkit.study.live import RaterService  # noqa: E402

LOG = logging.getLogger("evalkit.serve")

STATIC = Path(__file__).resolve().parent / "static"
STALE = "This trial was already answered (in another tab or on another device); here is the next one."
NO_TOKEN = "This page needs the invite link you were given (it has a token)."
# the Gradio shell around the player: no padding, no footer, the player fills the window
SHELL_CSS = """
body, gradio-app, .gradio-container { background: #1b1b1f !important; }
.gradio-container { padding: 0 !important; margin: 0 !important; max-width: none !important; }
.gradio-container > .main, .gradio-container .contain, .gradio-container .wrap { padding: 0 !important; gap: 0 !important; }
.gradio-container main { padding: 0 !important; }
#player, #player > .html-container { padding: 0 !important; margin: 0 !important; }
footer { display: none !important; }
"""


def _read(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _token(request: gr.Request | None) -> str:
    return (request.query_params.get("token") or "") if request is not None else ""


async def load(svc: RaterService, token: str) -> dict:
    """The rater's view when the page loads (hands out the current trial)."""
    if not token:
        return {"fatal": NO_TOKEN}
    try:
        return await svc.state(token)
    except UserError as e:
        return {"fatal": f"This invite link is not valid: {e}"}
    except Exception as e:
        return {"fatal": _unavailable(e, "load")}


def _unavailable(e: Exception, what: str) -> str:
    """The page's message when the database's disk is full or read-only (logged in one line);
    any other failure is raised."""
    line = storage_error(e)
    if line is None:
        raise e
    LOG.warning("rater %s: unavailable (%s)", what, line)
    lost = " Your answer was not saved." if what == "answer" else ""
    return (
        "The server cannot save anything right now (its disk is full or read-only)."
        f"{lost} Please try again later with the same link."
    )


async def answer(svc: RaterService, token: str, data: dict, client: str | None) -> dict:
    """One answer from the page (``data``: trial, answer, response_ms, nonce). An answer from a
    stale tab or a second device (the trial was answered meanwhile) gets the rater's current
    view with a notice, never an error."""
    data = data if isinstance(data, dict) else {}
    try:
        out = await svc.answer(token, data.get("trial"), data.get("answer"), data.get("response_ms"), client)
    except (study.OutOfOrder, study.RatingConflict):
        out = {**await load(svc, token), "notice": STALE}
    except (study.TooSoon, study.NotLoaded) as e:
        out = {"error": str(e), "wait_ms": e.wait_ms}
    except (study.UnknownToken, study.TrialNotAssigned, study.UnknownTrial) as e:
        out = {"fatal": str(e)}
    except UserError as e:
        out = {"error": str(e)}
    except Exception as e:
        out = {"error": _unavailable(e, "answer")}
    out["nonce"] = data.get("nonce")
    return out


class AnswerEvent(gr.EventData):
    """The player's ``answer`` event, as Gradio passes an event's payload to a listener whose
    argument is hinted with a :class:`gradio.EventData` subclass (as ``gr.SelectData`` does):
    ``payload`` is what the page sent (the answer, its nonce and the trial's token)."""

    def __init__(self, target, data):
        super().__init__(target, data)
        self.payload = data


def build_rater(svc: RaterService) -> gr.Blocks:
    """The rater page over ``svc``. Both events bypass Gradio's queue (the service orders and
    batches the database work itself) and show no progress overlay."""
    with gr.Blocks(title="Video comparison", analytics_enabled=False, fill_width=True) as demo:
        player = gr.HTML(
            value=None,
            html_template=_read("player.html"),
            css_template=_read("player.css"),
            js_on_load=_read("player.js"),
            elem_id="player",
            apply_default_css=False,
        )

        async def on_load(request: gr.Request):
            return await load(svc, _token(request))

        async def on_answer(evt: AnswerEvent, request: gr.Request):
            return await answer(svc, _token(request), evt.payload, request.headers.get("user-agent"))

        # not through Gradio's queue: each event is one POST (/gradio_api/run/<name>) answered
        # when the service has committed; the queue's per-event bookkeeping (join, stream,
        # estimations broadcast to every waiting event) cost 7 ms of server CPU per answer
        # against 1.9 ms without it, and 1.2 ms without output processing as well
        # (benchmarks/bench_app.py); the service orders and batches the database work itself
        # the value is a plain dict, which gr.HTML's postprocess would return as it is
        common = dict(
            outputs=player,
            show_progress="hidden",
            queue=False,
            postprocess=False,
            api_visibility="undocumented",
        )
        demo.load(on_load, api_name="trial", **common)
        player.answer(on_answer, api_name="answer", trigger_mode="multiple", **common)
    return demo
