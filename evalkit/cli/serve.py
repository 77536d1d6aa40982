"""``evalkit serve``: the web app."""

from __future__ import annotations

import sys

from evalkit.cli.common import port_number


def cmd_serve(args) -> int:
    from evalkit.app.server import serve  # evalkit.app: the web layer, installed with evalkit

    stopped_by = serve(
        args.db,
        host=args.host,
        port=args.port,
        admin_password=args.admin_password,
        completion_code=args.completion_code,
    )
    # Ctrl-C (SIGINT) and SIGTERM are the normal way to stop a server: a clean stop exits 0;
    # a further Ctrl-C while the process winds down must not turn that into a traceback
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(
        f"serve: stopped{' by ' + stopped_by if stopped_by else ''}; every acknowledged rating is stored",
        file=sys.stderr,
        flush=True,
    )
    return 0


def add_serve(sub, common) -> None:
    s = sub.add_parser(
        "serve",
        parents=[common],
        help="the blind A/B web app: rater page (invite links) and admin page",
        description="Serve the rater page (/?token=...) and the admin page "
        "(/admin/) until Ctrl-C or SIGTERM, which stop it cleanly (exit 0).",
    )
    s.add_argument("--db", required=True, help="database URL or SQLite file")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=port_number, default=7860, help="port, 1-65535 (default 7860)")
    s.add_argument(
        "--admin-password",
        default=None,
        help="password of the admin page (user admin); default: a random one, printed",
    )
    s.add_argument(
        "--completion-code", default=None, help="code shown to a rater who has answered every trial"
    )
    s.set_defaults(func=cmd_serve)
