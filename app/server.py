"""The study web app: a FastAPI app serving the rater page (static HTML + JS in ``app/static``)
and a small JSON API, with the Gradio admin page mounted at ``/admin`` behind a password.

Thin layer: every decision (which trial is next, whether an answer is valid, who may answer
what) is made by :mod:`evalkit.study`; this module only maps HTTP to those calls.

Rater endpoints (the token comes in the query or the JSON body; nothing here names a backend,
run or job):
  GET  /?token=T                 the rater page (static)
  GET  /api/trial?token=T        {"progress", "trial"} (trial None when finished) + completion code
  POST /api/answer               {"token", "trial", "answer", "response_ms"} -> same as /api/trial
  GET  /media/<sha256>.mp4?token=T   a file of the rater's study media folder, by exact hash name
Admin: /admin (Gradio, password), /export/<study>/ratings.csv and /summary.csv (HTTP Basic).
"""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402
from sqlalchemy import select  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.errors import UserError  # noqa: E402
from evalkit.study import store  # noqa: E402
from evalkit.study.api import token_hash  # noqa: E402

STATIC = Path(__file__).resolve().parent / "static"
MEDIA_NAME = re.compile(r"^[0-9a-f]{64}\.mp4$")
STATUS = {study.UnknownToken: 403, study.TrialNotAssigned: 403, study.UnknownTrial: 404,
          study.UnknownStudy: 404, study.BadAnswer: 400, study.RatingConflict: 409}
NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff"}


def _error(e: Exception) -> JSONResponse:
    code = next((c for t, c in STATUS.items() if isinstance(e, t)), 400)
    return JSONResponse({"error": str(e)}, status_code=code, headers=NO_STORE)


def _media_dir(db, token: str) -> Path | None:
    """The media folder of the study of the rater with this token (None: no such rater)."""
    if not isinstance(token, str) or not token:
        return None
    d = store.open_db(db)
    with d.engine.connect() as conn:
        row = conn.execute(select(store.studies.c.media_dir)
                           .join(store.raters, store.raters.c.study_id == store.studies.c.id)
                           .where(store.raters.c.token_sha256 == token_hash(token))).first()
    return None if row is None else Path(row[0])


def build_app(db: str, admin_password: str | None = None, completion_code: str | None = None,
              with_admin: bool = True) -> FastAPI:
    """The whole app. ``admin_password`` None: a random one is made (and printed by ``serve``)."""
    store.open_db(db)          # fail early on a bad database
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    api.state.admin_password = admin_password or secrets.token_urlsafe(12)

    def state(token: str) -> dict:
        p = study.progress(db, token)
        t = study.next_trial(db, token)
        out = {"progress": p, "trial": t}
        if t is None and completion_code:
            out["completion_code"] = completion_code
        return out

    @api.get("/healthz")
    def healthz():
        return {"ok": True}

    @api.get("/")
    def rater_page():
        return FileResponse(STATIC / "rater.html", headers=NO_STORE)

    @api.get("/api/trial")
    def get_trial(token: str = ""):
        try:
            return JSONResponse(state(token), headers=NO_STORE)
        except UserError as e:
            return _error(e)

    @api.post("/api/answer")
    async def post_answer(request: Request):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return JSONResponse({"error": "expected a JSON object"}, status_code=400)
        token = body.get("token", "")
        try:
            r = study.submit(db, token, body.get("trial"), body.get("answer"),
                             body.get("response_ms"), client=request.headers.get("user-agent"))
            return JSONResponse({"saved": r["new"], **state(token)}, headers=NO_STORE)
        except UserError as e:
            return _error(e)

    @api.get("/media/{name}")
    def media(name: str, token: str = ""):
        if not MEDIA_NAME.fullmatch(name):
            return PlainTextResponse("not found", status_code=404)
        folder = _media_dir(db, token)
        if folder is None:
            return PlainTextResponse("rater token: no rater has this token", status_code=403)
        path = folder / name            # exact hash name inside the study's folder, no traversal
        if not path.is_file():
            return PlainTextResponse("not found", status_code=404)
        return FileResponse(path, media_type="video/mp4",
                            headers={"Cache-Control": "private, max-age=3600",
                                     "Referrer-Policy": "no-referrer"})

    def admin_ok(request: Request) -> bool:
        import base64
        h = request.headers.get("authorization", "")
        if not h.lower().startswith("basic "):
            return False
        try:
            _, _, pw = base64.b64decode(h[6:]).decode().partition(":")
        except Exception:
            return False
        return secrets.compare_digest(pw, api.state.admin_password)

    def export(request: Request, sid: str, which: str) -> Response:
        if not admin_ok(request):
            return PlainTextResponse("admin password required", status_code=401,
                                     headers={"WWW-Authenticate": 'Basic realm="evalkit admin"'})
        try:
            text = (study.ratings_csv(db, sid) if which == "ratings"
                    else study.summary_csv(study.results(db, sid, reps=1000)))
        except UserError as e:
            return _error(e)
        return Response(text, media_type="text/csv", headers={
            "Content-Disposition": f'attachment; filename="study{int(sid)}-{which}.csv"'})

    @api.get("/export/{sid}/ratings.csv")
    def export_ratings(request: Request, sid: str):
        return export(request, sid, "ratings")

    @api.get("/export/{sid}/summary.csv")
    def export_summary(request: Request, sid: str):
        return export(request, sid, "summary")

    api.mount("/static", StaticFiles(directory=STATIC), name="static")
    if with_admin:
        import gradio as gr

        from .admin import build_admin
        blocks = build_admin(db)
        api = gr.mount_gradio_app(api, blocks, path="/admin",
                                  auth=("admin", api.state.admin_password),
                                  auth_message="evalkit study admin", footer_links=[])
    return api


def serve(db: str, host: str = "127.0.0.1", port: int = 7860, admin_password: str | None = None,
          completion_code: str | None = None) -> None:
    import uvicorn

    app = build_app(db, admin_password, completion_code)
    print(f"rater page: http://{host}:{port}/?token=<token>   admin: http://{host}:{port}/admin "
          f"(user admin{'' if admin_password else ', password ' + app.state.admin_password})",
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
