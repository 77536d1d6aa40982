"""Bad input, one row per input, grouped by command: each gives exit code 2 and one line
``error: ...`` naming the file or field (what was expected, what was found), or the documented
outcome (a failed job, a report that renders); never a traceback, a hang or a silent wrong
answer. The rows run the real CLI in-process (``evalkit.cli.main``); a sample of them runs
again as real processes (``python -m evalkit``), and a last test checks that no row printed a
traceback. docs/formats.md#input-validation lists the rules and this suite's row count.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import sys
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
from conftest import DATASETS, assert_one_line_error, run_evalkit

SMOKE_CLIP = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"


def _png(path: Path, w: int, h: int) -> None:
    """A valid 1-bit PNG of w x h (a 20000 x 20000 one is 48 KB)."""
    raw = zlib.compress(b"".join(b"\0" + bytes((w + 7) // 8) for _ in range(h)), 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
        + chunk(b"IDAT", raw)
        + chunk(b"IEND", b"")
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _suite(w, name: str, body: str) -> Path:
    """A suite file in the work folder: ``body`` below a valid header (``{clip}``: a clip)."""
    p = w.root / "suites" / f"{name}.yaml"
    p.parent.mkdir(exist_ok=True)
    p.write_text(body.replace("{clip}", str(SMOKE_CLIP)))
    return p


HEAD = "schema_version: 1\nname: s\n"
CLIPS = "clips: [{id: pan, path: {clip}}]\n"
JOBS = "prompts: [a]\nseeds: [0]\n"


def _gate(w, name: str, text: str) -> Path:
    p = w.root / "gates" / f"{name}.yaml"
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return p


def _copy_with(src: Path, dst: Path, filename: str, edit, raw) -> Path:
    """A copy of the folder ``src`` at ``dst`` whose JSON file ``filename`` is edited
    (``edit(doc)``) or replaced (``raw``); made once."""
    if not dst.exists():
        shutil.copytree(src, dst)
        f = dst / filename
        if raw is not None:
            f.write_text(raw)
        else:
            doc = json.loads(f.read_text())
            edit(doc)
            f.write_text(json.dumps(doc))
    return dst


def _run_with(w, name: str, edit: Callable[[dict], object] | None = None, raw: str | None = None) -> Path:
    """A copy of run A (``bad_runs/NAME/cpu``: where ``render -b cpu -o bad_runs/NAME`` writes)
    whose manifest.json is edited (``edit(doc)``) or replaced (``raw``)."""
    return _copy_with(w.run_a, w.root / "bad_runs" / name / "cpu", "manifest.json", edit, raw)


def _report_with(w, name: str, edit: Callable[[dict], object] | None = None, raw: str | None = None) -> Path:
    """A copy of the report whose summary.json is edited or replaced."""
    return _copy_with(w.report, w.root / "bad_reports" / name, "summary.json", edit, raw)


BOMB = (
    HEAD
    + CLIPS
    + "seeds: [0]\nprompts:\n"
    + '  - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(f"  - &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9))
)

#: the `command` renderer's program: writes frames of the wrong size or count (MODE)
COMMAND = textwrap.dedent("""\
    import json, os, sys
    import numpy as np
    from PIL import Image
    job = json.load(open(sys.argv[-1]))      # CMD MODE JOB_JSON
    out, mode = os.environ["EVALKIT_OUTPUT_DIR"], sys.argv[1]
    n, w, h = job["frames"], job["width"], job["height"]
    if mode == "small":             # 32x32 frames for a 64x64 source
        for i in range(n):
            Image.fromarray(np.zeros((h // 2, w // 2, 3), np.uint8)).save(f"{out}/{i:05d}.png")
    elif mode == "many_png":        # three times the frames, as images
        for i in range(3 * n):
            Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(f"{out}/{i:05d}.png")
    elif mode == "many_mkv":        # 400 frames where 8 are expected (no count in the header)
        from evalkit.video import write_lossless
        write_lossless(f"{out}/o.mkv", np.zeros((50 * n, h, w, 3), np.uint8), 24)
    elif mode == "png16":           # 16-bit PNGs: the source's values x 257, plus 100
        import cv2
        src = os.environ["EVALKIT_INPUT_FRAMES"]
        for i, name in enumerate(sorted(os.listdir(src))):
            x = np.asarray(Image.open(os.path.join(src, name))).astype(np.uint16) * 257 + 100
            cv2.imwrite(f"{out}/{i:05d}.png", np.ascontiguousarray(x[..., ::-1]))
    else:                           # right: as many frames of the source's size
        for i in range(n):
            Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(f"{out}/{i:05d}.png")
""")


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The world the rows work in: a compare report of two fake runs, a study database with a
    study and a rater, and bad files of every kind."""
    from evalkit import study
    from evalkit.testing.studies import make_report

    root = tmp_path_factory.mktemp("bad")
    report = make_report(root, seeds=(0,))
    w = SimpleNamespace(
        root=root,
        report=report,
        suite=root / "suite.yaml",
        run_a=root / "runs" / "cpu",
        run_b=root / "runs" / "cpu_dtype-bf16",
        db=root / "s.db",
    )
    w.clip = next((w.run_a / "clips").glob("pan-*.mkv"))
    study.create_study(report, w.db, protocol="abx", clips_spec="sample:1", allow_masking=True)
    study.invite(w.db, 1, 1)
    w.text = root / "notes.txt"
    w.text.write_text("not a database\n")
    w.folder = root / "a_folder"
    w.folder.mkdir()
    w.empty = root / "empty.db"
    w.empty.write_bytes(b"")
    _png(root / "big.png", 20000, 20000)
    _png(root / "mid.png", 9000, 9000)
    w.big, w.mid = root / "big.png", root / "mid.png"
    (root / "bigframes").mkdir()
    shutil.copy(w.big, root / "bigframes" / "0001.png")
    (root / "fake.mkv").write_text("not a video")
    (root / "empty.mkv").write_bytes(b"")
    (root / "noframes").mkdir()
    (root / "cmd.py").write_text(COMMAND)
    w.port = _free_port()  # nothing listens there: PostgreSQL refuses
    return w


@dataclass
class Row:
    group: str
    id: str
    argv: Callable[[SimpleNamespace], list]
    needles: tuple = ()
    code: int = 2
    #: a check of (w, out, err) for rows whose documented outcome is not a one-line error
    check: Callable | None = None
    #: run again as a real process in test_rows_as_real_processes
    process: bool = False
    #: run in the work folder (the row's paths are relative to it)
    in_root: bool = False


def E(group, id, argv, *needles, process=False):
    return Row(group, id, argv, needles, process=process)


def S(group, id, argv, check, code=0, in_root=False):
    return Row(group, id, argv, code=code, check=check, in_root=in_root)


def _job_failed(*needles):
    """render exits 1 and lists the failed job with its reason (rendering.md)."""

    def check(w, out, err):
        assert "1 failed" in out, out
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("failed "))
        for n in needles:
            assert n in line, (n, line)

    return check


def _rendered(w, out, err):
    assert "1 rendered, 0 already done, 0 failed" in out, out


def _math_report_ok(w, out, err):
    rep = w.root / "math_report"
    summary = json.loads((rep / "summary.json").read_text())
    assert len(summary["jobs"]["compared"]) == 2
    assert Path(summary["runs"]["a"]["path"]).is_absolute()  # usable from any folder
    html = (rep / "index.html").read_text()
    assert "cost $$ here" in html and "$\\foo{ x" in html
    assert list((rep / "img").glob("*.png"))


def _study_created(w, out, err):
    assert out.startswith("study 1: abx, 1 clips"), out


def _plan_ok(w, out, err):
    assert "included raters" in out and "clips raised from 5 to the floor of 15" in out


RUN = ["-r", "evalkit.testing.renderers:Invert", "--quiet"]


def _render(w, *extra, out="o"):
    return ["render", w.suite, "-b", "cpu", "-o", w.root / out, *extra]


def _cmd(mode):
    return lambda w: [
        "render",
        w.suite,
        "-b",
        "cpu",
        "-o",
        w.root / f"cmd_{mode}",
        "--quiet",
        "--jobs",
        "pan",
        "-r",
        "command",
        "-O",
        f"cmd={sys.executable} {w.root / 'cmd.py'} {mode}",
    ]


def _png16_kept(w, out, err):
    """The 16-bit PNGs (8-bit values x 257 + 100) were stored as the 8-bit values, not white."""
    from evalkit.video import read_frames

    assert "1 rendered, 0 already done, 0 failed" in out, out
    clip = next((w.root / "cmd_png16" / "cpu" / "clips").glob("pan-*"))
    assert (read_frames(clip)[0] == read_frames(SMOKE_CLIP)[0]).all()


def _ramp16(w, name: str) -> Path:
    """A 16-bit gray ramp PNG (ramp16.png) and its 8-bit rounding (ramp8.png) in the work
    folder; the path of ``name``."""
    import cv2
    import numpy as np

    ramp = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16 + 7).astype(np.uint16)
    cv2.imwrite(str(w.root / "ramp16.png"), ramp)
    cv2.imwrite(str(w.root / "ramp8.png"), np.floor(ramp / 257 + 0.5).astype(np.uint8))
    return w.root / name


def _bit_identical(w, out, err):
    assert "bit-identical: every frame is exactly the same" in out, out


def _fifo(w, name: str) -> Path:
    """A FIFO in the work folder (nothing ever writes it: a reader would wait for good)."""
    p = w.root / name
    if not p.exists():
        os.mkfifo(p)
    return p


def _pan_job(w):
    from evalkit.formats.suite import load_suite

    return next(j for j in load_suite(w.suite, check_clips=False).jobs if j.clip == "pan")


def _import(w, name: str, write=None):
    """``render -r import`` of job pan from ``import_NAME/``, where ``write(stem, frames)`` put
    the job's file (``stem``: the folder and the job id; ``frames``: the source's)."""
    from evalkit.video import read_frames

    d = w.root / f"import_{name}"
    if write is not None and not d.exists():
        d.mkdir()
        write(d / _pan_job(w).id, read_frames(SMOKE_CLIP)[0])
    return [
        "render",
        w.suite,
        "-b",
        "cpu",
        "-o",
        w.root / f"imp_{name}",
        "--quiet",
        "--jobs",
        "pan",
        "-r",
        "import",
        "-O",
        f"dir={d}",
    ]


def _reimport(w):
    """Job pan imported from one folder, then again from another whose file differs."""
    from evalkit.render.driver import render_suite
    from evalkit.video import write_lossless

    first = _import(w, "first", lambda stem, f: write_lossless(f"{stem}.mkv", f, 24))
    render_suite(
        w.suite,
        ["cpu"],
        w.root / "imp_first",
        renderer="import",
        jobs=["pan"],
        options={"dir": str(w.root / "import_first")},
        progress=False,
    )
    again = _import(w, "again", lambda stem, f: write_lossless(f"{stem}.mkv", 255 - f, 24))
    return [*first[:5], w.root / "imp_first", *again[6:]]


def _gate_e3_read_as_a_number(w, out, err):
    summary = json.loads((w.root / "r_e3" / "summary.json").read_text())
    assert summary["gate"]["checks"][0]["max"] == 1e-5, summary["gate"]["checks"][0]


def _floor_copy(w) -> Path:
    """A copy of run A elsewhere: a floor compare takes for a re-render of A."""
    dst = w.root / "floor_copy" / "cpu"
    if not dst.exists():
        shutil.copytree(w.run_a, dst)
    return dst


def _db_with(w, name: str, sql: str) -> Path:
    """A copy of the study database, changed by ``sql`` (a damaged or tampered database)."""
    import sqlite3

    dst = w.root / f"{name}.db"
    if not dst.exists():
        src, conn = sqlite3.connect(w.db), sqlite3.connect(dst)
        src.backup(conn)  # the WAL's pages too
        src.close()
        with conn:
            conn.execute(sql)
        conn.close()
    return dst


def _b_with_clip(w, name: str, edit, honest: bool) -> Path:
    """A copy of run B whose pan job's clip is ``edit(frames)`` (its sha256 recorded); its
    manifest's frame count and size updated too when ``honest`` (as a render records them)."""
    from evalkit.fsutil import sha256_file
    from evalkit.video import read_frames, write_lossless

    dst = w.root / "bad_b" / name / "cpu_dtype-bf16"
    if not dst.exists():
        shutil.copytree(w.run_b, dst)
        doc = json.loads((dst / "manifest.json").read_text())
        rec = next(j for j in doc["jobs"] if j["clip"] == "pan")
        clip = dst / rec["output"]["path"]
        frames = edit(read_frames(clip)[0])
        write_lossless(clip, frames, 24)
        rec["output"]["sha256"] = sha256_file(clip)
        if honest:
            rec["output"].update(frames=len(frames), width=frames.shape[2], height=frames.shape[1])
        (dst / "manifest.json").write_text(json.dumps(doc))
    return dst


def _pan_not_compared(*needles):
    def check(w, out, err):
        line = next(ln for ln in out.splitlines() if "not compared pan-" in ln)
        for n in needles:
            assert n in line, (n, line)
        assert "compared 1 jobs (1 not compared)" in out, out

    return check


#: a cell that a reader splitting rows at a bare carriage return would end a row in, its next
#: row a formula (the sweep's `--label $'lab\r=cmd...'` and prompts)
EVIL = "lab\r=cmd|' /C calc'!A0"


def _no_formula_anywhere(text: str, rows: int, column: str, expect: str) -> None:
    """The CSV ``text`` parses to ``rows`` rows whose ``column`` is ``expect`` neutralised; no
    line of it (split at any line break, as a careless reader would) starts a formula."""
    import csv
    import io

    parsed = list(csv.DictReader(io.StringIO(text, newline="")))
    assert len(parsed) == rows, parsed
    assert {r[column] for r in parsed} == {expect.replace("\r=", "\r'=")}, parsed
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        for cell in line.split(","):
            assert not cell.strip('"').startswith(("=", "+", "@")), (cell, line)


def _evil_prompt_runs(w) -> list[Path]:
    """Copies of runs A and B whose pan job's prompt is :data:`EVIL` (in both manifests)."""
    out = []
    for run in (w.run_a, w.run_b):
        dst = w.root / "evil_runs" / run.name
        if not dst.exists():
            shutil.copytree(run, dst)
            doc = json.loads((dst / "manifest.json").read_text())
            next(j for j in doc["jobs"] if j["clip"] == "pan")["prompt"] = EVIL
            (dst / "manifest.json").write_text(json.dumps(doc))
        out.append(dst)
    return out


def _report_csvs_safe(w, out, err):
    import csv
    import io

    rep = w.root / "r_evil"
    assert len(json.loads((rep / "summary.json").read_text())["jobs"]["compared"]) == 2
    for name, n in (("clips.csv", 2), ("frames.csv", 16)):
        text = (rep / name).read_bytes().decode()
        parsed = list(csv.DictReader(io.StringIO(text, newline="")))
        assert len(parsed) == n, (name, len(parsed))
        assert {r["prompt"] for r in parsed} == {"a", EVIL.replace("\r=", "\r'=")}, name
        for line in text.replace("\r", "\n").split("\n"):
            assert not line.lstrip('"').startswith(("=", "+", "@")), (name, line)


def _evil_label_db(w) -> Path:
    """A copy of the study database with a rater labelled :data:`EVIL` who answered a trial."""
    from evalkit import study
    from evalkit.testing.studies import answer

    db = w.root / "evil.db"
    if not db.exists():
        _db_with(w, "evil", "SELECT 1")
        token = study.invite(db, 1, 1, label=EVIL)[0]["token"]
        answer(db, token, lambda t: "A", limit=1)
    return db


def _ratings_csv_safe(w, out, err):
    _no_formula_anywhere((w.root / "evil.csv").read_bytes().decode(), 1, "rater_label", EVIL)


def _study(w, *extra, db=None):
    return [
        "study",
        "create",
        "--allow-masking",
        w.report,
        "--db",
        db if db is not None else w.root / "new.db",
        "--protocol",
        "abx",
        *extra,
    ]


def _deep_report(w):
    """A report folder whose summary.json is 100,000 nested arrays."""
    d = w.root / "deepreport"
    d.mkdir(exist_ok=True)
    (d / "summary.json").write_text("[" * 100000)
    return d


def _pg(w):
    return f"postgresql+psycopg://evalkit:secret@127.0.0.1:{w.port}/studies"


def _tiny_clips(w, width: int, height: int) -> list[Path]:
    """Two different lossless clips of 4 frames of width x height (import accepts them)."""
    import numpy as np

    from evalkit.video import write_lossless

    out = []
    for k in range(2):
        p = w.root / "tiny" / f"{width}x{height}-{k}.mkv"
        if not p.exists():
            p.parent.mkdir(exist_ok=True)
            rng = np.random.default_rng(k)
            write_lossless(p, rng.integers(0, 256, (4, height, width, 3), dtype=np.uint8), 24)
        out.append(p)
    return out


def _set_aggregate(value):
    def edit(doc):
        doc["aggregates"]["lpips"]["mean"] = value

    return edit


def _deep_field(w, name: str) -> Path:
    """A copy of the report whose summary.json holds 100,000 nested arrays in one field."""
    d = w.root / "bad_reports" / name
    if not d.exists():
        shutil.copytree(w.report, d)
        text = (d / "summary.json").read_text()
        (d / "summary.json").write_text(
            text.replace('"aggregates": {', '"deep": ' + "[" * 100000 + "]" * 100000 + ', "aggregates": {', 1)
        )
    return d


LPIPS_GATE = "lpips: {mean: {max: 0.5}}\n"


def _rgba_frames(stem, frames, opaque: bool) -> None:
    """The job's frames as RGBA PNGs in ``stem/``: opaque, or with one pixel of frame 2
    transparent (alpha 10)."""
    import numpy as np
    from PIL import Image

    Path(stem).mkdir()
    for i, f in enumerate(frames):
        a = np.dstack([f, np.full(f.shape[:2], 255, np.uint8)])
        if not opaque and i == 2:
            a[5, 5, 3] = 10
        Image.fromarray(a, "RGBA").save(f"{stem}/{i:05d}.png")


def _alpha_mkv(stem, frames) -> None:
    """The job's frames as FFV1 bgra (an alpha channel), one pixel of frame 2 transparent."""
    import av
    import numpy as np

    with av.open(f"{stem}.mkv", "w") as c:
        st = c.add_stream("ffv1", rate=24)
        st.width, st.height, st.pix_fmt = frames.shape[2], frames.shape[1], "bgra"
        for i, f in enumerate(frames):
            a = np.dstack([f, np.full(f.shape[:2], 255, np.uint8)])
            if i == 2:
                a[5, 5, 3] = 10
            for pk in st.encode(av.VideoFrame.from_ndarray(a, format="rgba")):
                c.mux(pk)
        for pk in st.encode():
            c.mux(pk)


def _floor_of_a_changed_clip(w) -> list:
    """``floor`` of a copy of run A whose clip was overwritten by another after render."""
    d = w.root / "hash_changed" / "cpu"
    if not d.exists():
        shutil.copytree(w.run_a, d)
        clip = next((d / "clips").glob("pan-*.mkv"))
        other = next((w.run_b / "clips").glob("pan-*.mkv"))
        shutil.copy(other, clip)
    return ["floor", d, "--out", w.root / "hash_floors"]


ROWS = [
    # -- probe -----------------------------------------------------------------------------
    E("probe", "missing", lambda w: ["probe", w.root / "nothere.mkv"], "nothere.mkv", "file not found"),
    E("probe", "yaml", lambda w: ["probe", w.suite], "suite.yaml", "unsupported file type '.yaml'"),
    E("probe", "text-as-mkv", lambda w: ["probe", w.root / "fake.mkv"], "fake.mkv", "not a readable video"),
    E("probe", "empty-mkv", lambda w: ["probe", w.root / "empty.mkv"], "empty.mkv", "empty file"),
    E("probe", "empty-folder", lambda w: ["probe", w.root / "noframes"], "noframes", "no PNG/JPEG/BMP"),
    E(
        "probe",
        "png-20000x20000",
        lambda w: ["probe", w.big],
        "big.png",
        "frame too large",
        "400,000,000 pixels",
        process=True,
    ),
    E("probe", "png-9000x9000", lambda w: ["probe", w.mid], "mid.png", "found 9000x9000"),
    E(
        "probe",
        "folder-with-huge-frame",
        lambda w: ["probe", w.root / "bigframes"],
        "0001.png",
        "frame too large",
    ),
    # -- metrics ---------------------------------------------------------------------------
    E(
        "metrics",
        "csv-is-a-folder",
        lambda w: ["metrics", w.clip, w.clip, "--csv", w.folder],
        "argument --csv",
        "found a folder",
        process=True,
    ),
    E(
        "metrics",
        "csv-under-a-file",
        lambda w: ["metrics", w.clip, w.clip, "--csv", w.text / "x.csv"],
        "argument --csv",
        "is not a folder",
    ),
    E(
        "metrics",
        "csv-empty",
        lambda w: ["metrics", w.clip, w.clip, "--csv="],
        "argument --csv",
        "empty string",
    ),
    E(
        "metrics",
        "missing-a",
        lambda w: ["metrics", w.root / "nothere.mkv", w.clip],
        "nothere.mkv",
        "file not found",
    ),
    E("metrics", "huge-image", lambda w: ["metrics", w.clip, w.big], "big.png", "frame too large"),
    E(
        "metrics",
        "yaml-as-clip",
        lambda w: ["metrics", w.suite, w.clip],
        "suite.yaml",
        "unsupported file type",
    ),
    S(
        "metrics",
        "16-bit-png-against-its-8-bit-rounding",
        lambda w: ["metrics", _ramp16(w, "ramp16.png"), _ramp16(w, "ramp8.png"), "--device", "cpu"],
        _bit_identical,
    ),
    E(
        "metrics",
        "fifo-as-clip",
        lambda w: ["metrics", _fifo(w, "fifo.mkv"), w.clip],
        "fifo.mkv",
        "not a regular file",
        "found a FIFO",
        process=True,
    ),
    E(
        "metrics",
        "chunk-0",
        lambda w: ["metrics", w.clip, w.clip, "--chunk", "0"],
        "chunk",
        "positive integer",
        "found 0",
    ),
    E(
        "metrics",
        "flow-scale-0",
        lambda w: ["metrics", w.clip, w.clip, "--flow-scale", "0"],
        "flow scale",
        "(0, 1]",
    ),
    E(
        "metrics",
        "flow-scale-nan",
        lambda w: ["metrics", w.clip, w.clip, "--flow-scale", "nan"],
        "flow scale",
        "found nan",
    ),
    E(
        "metrics",
        "device-bogus",
        lambda w: ["metrics", w.clip, w.clip, "--device", "bogus"],
        "device",
        "found 'bogus'",
    ),
    E(
        "metrics",
        "net-bogus",
        lambda w: ["metrics", w.clip, w.clip, "--net", "resnet"],
        "argument --net",
        "invalid choice",
    ),
    # -- suite validate --------------------------------------------------------------------
    E(
        "suite",
        "missing",
        lambda w: ["suite", "validate", w.root / "nothere.yaml"],
        "nothere.yaml",
        "file not found",
    ),
    E("suite", "folder", lambda w: ["suite", "validate", w.folder], "a_folder", "not a file"),
    E("suite", "empty", lambda w: ["suite", "validate", _suite(w, "empty", "")], "empty.yaml", "empty file"),
    E(
        "suite",
        "invalid-yaml",
        lambda w: ["suite", "validate", _suite(w, "inv", "a: [b\n")],
        "inv.yaml",
        "invalid YAML at line",
    ),
    E(
        "suite",
        "top-level-list",
        lambda w: ["suite", "validate", _suite(w, "list", "- a\n")],
        "list.yaml",
        "expected a YAML mapping",
    ),
    E(
        "suite",
        "binary",
        lambda w: ["suite", "validate", _suite(w, "bin", "\x00\x01\x02")],
        "bin.yaml",
        "invalid YAML",
    ),
    E(
        "suite",
        "yaml-alias-bomb",
        lambda w: ["suite", "validate", _suite(w, "bomb", BOMB)],
        "bomb.yaml",
        "aliases expanded",
        process=True,
    ),
    E(
        "suite",
        "recursive-alias",
        lambda w: ["suite", "validate", _suite(w, "rec", HEAD + "clips: &c [*c]\n")],
        "rec.yaml",
        "alias *c refers to a value that contains it",
    ),
    E(
        "suite",
        "clip-is-a-fifo",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "fifo", HEAD + f"clips: [{{id: x, path: {_fifo(w, 'fifo.mkv')}}}]\n" + JOBS),
        ],
        "field 'clips[0].path'",
        "not a regular file",
        "found a FIFO",
    ),
    E(
        "suite",
        "duplicate-key",
        lambda w: ["suite", "validate", _suite(w, "dupkey", HEAD + CLIPS + JOBS + "prompts: [b]\n")],
        "dupkey.yaml",
        "at line 6",
        "duplicate key 'prompts'",
        "first at line 4",
        process=True,
    ),
    E(
        "suite",
        "duplicate-key-in-a-clip",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "dupclip", HEAD + "clips: [{id: pan, path: {clip}, id: x}]\n" + JOBS),
        ],
        "dupclip.yaml",
        "at line 3",
        "duplicate key 'id'",
    ),
    E(
        "suite",
        "nested-20000-deep",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "deep", HEAD + CLIPS + JOBS + "params: {x: " + "[" * 20000 + "]" * 20000 + "}\n"),
        ],
        "deep.yaml",
        "invalid YAML at line 6",
        "nested more than 100 levels deep",
        process=True,
    ),
    E(
        "suite",
        "schema-version-2",
        lambda w: ["suite", "validate", _suite(w, "v2", "schema_version: 2\nname: s\n" + CLIPS + JOBS)],
        "field 'schema_version'",
        "unsupported version 2",
    ),
    E(
        "suite",
        "no-name",
        lambda w: ["suite", "validate", _suite(w, "noname", "schema_version: 1\n" + CLIPS + JOBS)],
        "field 'name'",
        "missing",
    ),
    E(
        "suite",
        "bad-name",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "badname", "schema_version: 1\nname: 'a b'\n" + CLIPS + JOBS),
        ],
        "field 'name'",
        "found 'a b'",
    ),
    E(
        "suite",
        "unknown-key",
        lambda w: ["suite", "validate", _suite(w, "unknown", HEAD + CLIPS + JOBS + "colour: red\n")],
        "field 'colour'",
        "unknown key",
    ),
    E(
        "suite",
        "no-clips",
        lambda w: ["suite", "validate", _suite(w, "noclips", HEAD + JOBS)],
        "field 'clips'",
        "missing",
    ),
    E(
        "suite",
        "clips-empty",
        lambda w: ["suite", "validate", _suite(w, "clips0", HEAD + "clips: []\n" + JOBS)],
        "field 'clips'",
        "at least one clip",
    ),
    E(
        "suite",
        "clip-missing",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "clipgone", HEAD + "clips: [{id: x, path: gone.mkv}]\n" + JOBS),
        ],
        "field 'clips[0].path'",
        "clip not found",
    ),
    E(
        "suite",
        "clip-not-a-video",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "clipbad", HEAD + f"clips: [{{id: x, path: {w.root / 'fake.mkv'}}}]\n" + JOBS),
        ],
        "field 'clips[0].path'",
        "not a readable video",
    ),
    E(
        "suite",
        "clip-huge-png",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "clipbig", HEAD + f"clips: [{{id: x, path: {w.big}}}]\n" + JOBS),
        ],
        "field 'clips[0].path'",
        "frame too large",
    ),
    E(
        "suite",
        "clip-duplicate-id",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "dup", HEAD + "clips: [{id: x, path: {clip}}, {id: x, path: {clip}}]\n" + JOBS),
        ],
        "field 'clips[1].id'",
        "duplicate clip id",
    ),
    E(
        "suite",
        "prompts-empty",
        lambda w: ["suite", "validate", _suite(w, "p0", HEAD + CLIPS + "prompts: []\nseeds: [0]\n")],
        "field 'prompts'",
        "at least one prompt",
    ),
    E(
        "suite",
        "prompt-blank",
        lambda w: ["suite", "validate", _suite(w, "pblank", HEAD + CLIPS + "prompts: ['  ']\nseeds: [0]\n")],
        "field 'prompts[0]'",
        "non-empty prompt",
    ),
    E(
        "suite",
        "seed-negative",
        lambda w: ["suite", "validate", _suite(w, "sneg", HEAD + CLIPS + "prompts: [a]\nseeds: [-1]\n")],
        "field 'seeds[0]'",
        "[0, 2**63)",
    ),
    E(
        "suite",
        "seed-too-big",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "sbig", HEAD + CLIPS + "prompts: [a]\nseeds: [9223372036854775808]\n"),
        ],
        "field 'seeds[0]'",
        "[0, 2**63)",
    ),
    E(
        "suite",
        "seed-string",
        lambda w: ["suite", "validate", _suite(w, "sstr", HEAD + CLIPS + "prompts: [a]\nseeds: ['1']\n")],
        "field 'seeds[0]'",
        "expected an integer seed",
    ),
    E(
        "suite",
        "jobs-and-prompts",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "both", HEAD + CLIPS + JOBS + "jobs: [{clip: pan, prompt: a, seed: 0}]\n"),
        ],
        "field 'jobs'",
        "not both",
    ),
    E(
        "suite",
        "jobs-empty-item",
        lambda w: ["suite", "validate", _suite(w, "job0", HEAD + CLIPS + "jobs: [{}]\n")],
        "field 'jobs[0].clip'",
        "missing",
    ),
    E(
        "suite",
        "job-unknown-clip",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "jobclip", HEAD + CLIPS + "jobs: [{clip: nope, prompt: a, seed: 0}]\n"),
        ],
        "field 'jobs[0].clip'",
        "unknown clip 'nope'",
    ),
    E(
        "suite",
        "param-nan",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "pnan", HEAD + CLIPS + JOBS + "params: {strength: .nan}\n"),
        ],
        "field 'params.strength'",
        "finite number",
        "found nan",
    ),
    E(
        "suite",
        "param-inf",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "pinf", HEAD + CLIPS + JOBS + "params: {strength: .inf}\n"),
        ],
        "field 'params.strength'",
        "finite number",
    ),
    E(
        "suite",
        "param-list",
        lambda w: [
            "suite",
            "validate",
            _suite(w, "plist", HEAD + CLIPS + JOBS + "params: {strength: [1]}\n"),
        ],
        "field 'params.strength'",
        "expected a scalar",
    ),
    E(
        "suite",
        "preview-out-is-a-file",
        lambda w: ["suite", "preview", w.suite, "--out", w.text],
        "argument --out",
        "found a file",
    ),
    # -- render ----------------------------------------------------------------------------
    E(
        "render",
        "renderer-os-system",
        lambda w: _render(w, "-r", "os:system"),
        "renderer 'os:system'",
        "expected a renderer class",
        process=True,
    ),
    E(
        "render",
        "renderer-not-a-renderer-class",
        lambda w: _render(w, "-r", "subprocess:Popen"),
        "renderer 'subprocess:Popen'",
        "expected a renderer class",
    ),
    E("render", "renderer-a-string", lambda w: _render(w, "-r", "os:sep"), "renderer 'os:sep'", "found str"),
    E("render", "renderer-unknown", lambda w: _render(w, "-r", "nope"), "renderer 'nope'", "unknown"),
    E(
        "render",
        "renderer-no-module",
        lambda w: _render(w, "-r", "nope.mod:X"),
        "renderer 'nope.mod:X'",
        "cannot import module",
    ),
    E(
        "render",
        "renderer-option-not-key-value",
        lambda w: _render(w, *RUN, "-O", "=x"),
        "--renderer-opt",
        "key=value",
    ),
    E(
        "render",
        "renderer-option-unknown",
        lambda w: _render(w, *RUN, "-O", "bogus=1"),
        "unknown option 'bogus'",
    ),
    E(
        "render",
        "command-without-cmd",
        lambda w: _render(w, "-r", "command"),
        "renderer 'command'",
        "option 'cmd' is required",
    ),
    E(
        "render",
        "command-timeout-negative",
        lambda w: _render(w, "-r", "command", "-O", "cmd=true", "-O", "timeout=-1"),
        "option timeout",
        "found '-1'",
    ),
    E(
        "render",
        "command-timeout-nan",
        lambda w: _render(w, "-r", "command", "-O", "cmd=true", "-O", "timeout=nan"),
        "option timeout",
        "found 'nan'",
    ),
    E(
        "render",
        "command-timeout-text",
        lambda w: _render(w, "-r", "command", "-O", "cmd=true", "-O", "timeout=soon"),
        "option timeout",
        "found 'soon'",
    ),
    E(
        "render",
        "import-without-dir",
        lambda w: _render(w, "-r", "import"),
        "renderer 'import'",
        "option 'dir' is required",
    ),
    E(
        "render",
        "import-dir-missing",
        lambda w: _render(w, "-r", "import", "-O", f"dir={w.root / 'gone'}"),
        "gone",
        "not a folder",
    ),
    E(
        "render",
        "backend-bogus",
        lambda w: ["render", w.suite, "-b", "tpu", "-o", w.root / "o"],
        "backend spec 'tpu'",
        "device 'tpu'",
    ),
    E(
        "render",
        "backend-dtype-fp8",
        lambda w: ["render", w.suite, "-b", "cpu,dtype=fp8", "-o", w.root / "o"],
        "dtype='fp8'",
    ),
    E(
        "render",
        "backend-unknown-key",
        lambda w: ["render", w.suite, "-b", "cpu,colour=red", "-o", w.root / "o"],
        "unknown key 'colour'",
    ),
    E(
        "render",
        "backend-resource-empty",
        lambda w: ["render", w.suite, "-b", "cpu,resource=", "-o", w.root / "o", *RUN],
        "resource= needs a value",
    ),
    E(
        "render",
        "backend-resource-without-ray",
        lambda w: ["render", w.suite, "-b", "cpu,resource=gpu8", "-o", w.root / "o", *RUN],
        "--backend 'cpu,resource=gpu8'",
        "only with --executor ray",
        process=True,
    ),
    E(
        "render",
        "seed-offset-negative",
        lambda w: _render(w, *RUN, "--seed-offset", "-1"),
        "--seed-offset",
        "found -1",
    ),
    E(
        "render",
        "seed-offset-huge",
        lambda w: _render(w, *RUN, "--seed-offset", str(2**70)),
        "--seed-offset",
        "below 2**63",
    ),
    E(
        "render",
        "ray-workers-0",
        lambda w: _render(w, *RUN, "--ray-workers", "0"),
        "argument --ray-workers",
        "positive integer",
    ),
    E(
        "render",
        "ray-option-without-ray",
        lambda w: _render(w, *RUN, "--ray-cpus", "2"),
        "--ray-cpus: only with --executor ray",
    ),
    E(
        "render",
        "jobs-match-nothing",
        lambda w: _render(w, *RUN, "--jobs", "nothing"),
        "--jobs",
        "'nothing' matches no job",
    ),
    E(
        "render",
        "out-is-a-file",
        lambda w: ["render", w.suite, "-b", "cpu", "-o", w.text, *RUN],
        "notes.txt",
        "not a folder",
    ),
    E(
        "render",
        "suite-missing",
        lambda w: ["render", w.root / "nothere.yaml", "-b", "cpu", "-o", w.root / "o"],
        "nothere.yaml",
        "file not found",
    ),
    E(
        "render",
        "manifest-jobs-empty-item",
        lambda w: [
            "render",
            w.suite,
            "-b",
            "cpu",
            "-o",
            _run_with(w, "jobs0", lambda d: d.update(jobs=[{}])).parent,
            *RUN,
        ],
        "manifest.json",
        "field 'jobs[0].id'",
        "missing",
    ),
    E(
        "render",
        "unknown-option",
        lambda w: _render(w, *RUN, "--colour", "red"),
        "unrecognized arguments: --colour red",
    ),
    E(
        "render",
        "no-backend",
        lambda w: ["render", w.suite, "-o", w.root / "o", "-r", "evalkit.testing.renderers:Invert"],
        "--backend: give at least one backend spec",
    ),
    S(
        "render",
        "command-right-output-relative-out",
        lambda w: [
            "render",
            w.suite,
            "-b",
            "cpu",
            "-o",
            "cmd_ok",
            "--quiet",
            "--jobs",
            "pan",
            "-r",
            "command",
            "-O",
            f"cmd={sys.executable} {w.root / 'cmd.py'} ok",
        ],
        _rendered,
        in_root=True,
    ),
    S(
        "render",
        "command-frames-too-small",
        _cmd("small"),
        _job_failed("command output", "frames are 32x32, expected 64x64"),
        code=1,
    ),
    S(
        "render",
        "command-too-many-images",
        _cmd("many_png"),
        _job_failed("command output", "24 frames, expected 8"),
        code=1,
    ),
    S(
        "render",
        "command-too-many-frames-in-a-video",
        _cmd("many_mkv"),
        _job_failed("command output", "more than 8 frames, expected 8"),
        code=1,
    ),
    S("render", "command-writes-16-bit-pngs", _cmd("png16"), _png16_kept),
    S(
        "render",
        "import-frames-too-small",
        lambda w: _import(
            w,
            "small",
            lambda stem, f: __import__("evalkit.video").video.write_lossless(
                f"{stem}.mkv", f[:, ::2, ::2], 24
            ),
        ),
        _job_failed("import of job pan-", "import_small/pan-", ".mkv", "frames are 32x32", "expected 64x64"),
        code=1,
    ),
    S(
        "render",
        "import-30-fps-for-a-24-fps-source",
        lambda w: _import(
            w, "fps30", lambda stem, f: __import__("evalkit.video").video.write_lossless(f"{stem}.mkv", f, 30)
        ),
        _job_failed("import_fps30/pan-", "30 frames/s, expected 24"),
        code=1,
    ),
    S(
        "render",
        "import-a-fifo",
        lambda w: _import(w, "fifo", lambda stem, f: os.mkfifo(f"{stem}.mkv")),
        _job_failed("import_fifo/pan-", "not a regular file"),
        code=1,
    ),
    E(
        "render",
        "import-again-with-other-content",
        _reimport,
        "imp_first/cpu/manifest.json",
        "was imported from",
        "import_first/pan-",
        "import_again/pan-",
        "has other content",
        "render into another --out folder",
        process=True,
    ),
    # -- compare ---------------------------------------------------------------------------
    E(
        "compare",
        "run-missing",
        lambda w: ["compare", w.root / "nothere", w.run_b, "-o", w.root / "r"],
        "nothere",
        "run folder not found (RUN_A)",
    ),
    E(
        "compare",
        "run-is-a-file",
        lambda w: ["compare", w.suite, w.run_b, "-o", w.root / "r"],
        "suite.yaml",
        "not a folder",
    ),
    E(
        "compare",
        "out-is-a-file",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.text],
        "notes.txt",
        "not a folder",
    ),
    E(
        "compare",
        "floor-missing",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.root / "r", "--floor", w.root / "nothere"],
        "nothere",
        "--floor",
    ),
    E(
        "compare",
        "device-bogus",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.root / "r", "--device", "tpu"],
        "device",
        "found 'tpu'",
    ),
    E(
        "compare",
        "manifest-missing",
        lambda w: ["compare", w.folder, w.run_b, "-o", w.root / "r"],
        "manifest.json",
        "not found",
    ),
    E(
        "compare",
        "manifest-not-json",
        lambda w: ["compare", _run_with(w, "notjson", raw="{"), w.run_b, "-o", w.root / "r"],
        "manifest.json",
        "not valid JSON",
    ),
    E(
        "compare",
        "manifest-a-list",
        lambda w: ["compare", _run_with(w, "list", raw="[]"), w.run_b, "-o", w.root / "r"],
        "manifest.json",
        "expected a JSON object",
    ),
    E(
        "compare",
        "manifest-schema-2",
        lambda w: [
            "compare",
            _run_with(w, "v2", lambda d: d.update(schema_version=2)),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "manifest.json",
        "schema_version 2",
    ),
    E(
        "compare",
        "manifest-jobs-empty-item",
        lambda w: [
            "compare",
            _run_with(w, "jobs0", lambda d: d.update(jobs=[{}])),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "manifest.json",
        "field 'jobs[0].id'",
        "missing",
        process=True,
    ),
    E(
        "compare",
        "manifest-jobs-not-a-list",
        lambda w: [
            "compare",
            _run_with(w, "jobsdict", lambda d: d.update(jobs={})),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "manifest.json",
        "field 'jobs'",
        "expected a list of job records",
    ),
    E(
        "compare",
        "manifest-status-bogus",
        lambda w: [
            "compare",
            _run_with(w, "status", lambda d: d["jobs"][0].update(status="maybe")),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "manifest.json",
        "field 'jobs[0].status'",
        "'maybe'",
    ),
    E(
        "compare",
        "manifest-sha256-bogus",
        lambda w: [
            "compare",
            _run_with(w, "sha", lambda d: d["jobs"][0]["output"].update(sha256="xyz")),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "manifest.json",
        "field 'jobs[0].output.sha256'",
        "64 lowercase hex digits",
    ),
    E(
        "compare",
        "manifest-output-path-absolute",
        lambda w: [
            "compare",
            _run_with(
                w,
                "outabs",
                lambda d: d["jobs"][0]["output"].update(path=str(w.run_b / d["jobs"][0]["output"]["path"])),
            ),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "outabs/cpu/manifest.json",
        "field 'jobs[0].output.path'",
        "relative to the run folder",
        process=True,
    ),
    E(
        "compare",
        "manifest-output-path-dotdot",
        lambda w: [
            "compare",
            _run_with(
                w,
                "outdots",
                lambda d: d["jobs"][0]["output"].update(
                    path="../../../runs/cpu_dtype-bf16/" + d["jobs"][0]["output"]["path"]
                ),
            ),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "outdots/cpu/manifest.json",
        "field 'jobs[0].output.path'",
        "inside it",
        "'../../../runs",
    ),
    E(
        "compare",
        "manifest-preview-outside",
        lambda w: [
            "compare",
            _run_with(w, "prevabs", lambda d: d["jobs"][0].update(preview="/etc/passwd")),
            w.run_b,
            "-o",
            w.root / "r",
        ],
        "prevabs/cpu/manifest.json",
        "field 'jobs[0].preview'",
        "'/etc/passwd'",
    ),
    E(
        "compare",
        "manifest-nested-100000-deep",
        lambda w: ["compare", _run_with(w, "deepjson", raw="[" * 100000), w.run_b, "-o", w.root / "r"],
        "deepjson/cpu/manifest.json",
        "not valid JSON (nested too deeply)",
        process=True,
    ),
    E(
        "compare",
        "floor-is-run-a",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.root / "r", "--floor", w.run_a],
        "--floor",
        "is RUN_A itself",
        process=True,
    ),
    E(
        "compare",
        "floor-is-run-b",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.root / "r", "--floor", w.run_b],
        "--floor",
        "is RUN_B itself",
    ),
    E(
        "compare",
        "gate-floor-unknown",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--floor",
            _floor_copy(w),
            "--gate",
            _gate(w, "nofloor", "floor_ratio: {lpips: {mean: {max: 2}}}\nfloor: nosuchfloor\n"),
        ],
        "nofloor.yaml",
        "field 'floor'",
        "no floor 'nosuchfloor'",
        "are: rerender",
        process=True,
    ),
    E(
        "compare",
        "gate-duplicate-metric",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "dupmetric", "lpips: {mean: {max: 0.1}}\nlpips: {mean: {max: 0.9}}\n"),
        ],
        "dupmetric.yaml",
        "at line 2",
        "duplicate key 'lpips' (first at line 1)",
        process=True,
    ),
    E(
        "compare",
        "gate-duplicate-bound",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "dupbound", "lpips: {mean: {max: 0.1, max: 0.9}}\n"),
        ],
        "dupbound.yaml",
        "at line 1",
        "duplicate key 'max'",
    ),
    E(
        "compare",
        "gate-min-above-max",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "minmax", "psnr: {mean: {min: 40, max: 30}}\n"),
        ],
        "minmax.yaml",
        "field 'psnr.mean'",
        "expected min <= max",
        "min 40 > max 30",
    ),
    S(
        "compare",
        "gate-bound-1e-5-is-a-number",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r_e3",
            "--device",
            "cpu",
            "--quiet",
            "--no-temporal",
            "--gate",
            _gate(w, "e3", "lpips: {mean: {max: 1e-5}}\n"),
        ],
        _gate_e3_read_as_a_number,
        code=1,
    ),
    S(
        "compare",
        "b-clip-with-fewer-frames",
        lambda w: [
            "compare",
            w.run_a,
            _b_with_clip(w, "short", lambda f: f[:5], True),
            "-o",
            w.root / "r_short",
            "--device",
            "cpu",
            "--quiet",
            "--no-temporal",
        ],
        _pan_not_compared(
            "not comparable: A ",
            "runs/cpu/clips/pan-",
            "is 8 frames of 64x64",
            "bad_b/short/cpu_dtype-bf16/clips/pan-",
            "is 5 frames of 64x64",
            "--align shortest",
        ),
    ),
    S(
        "compare",
        "b-clip-of-another-size",
        lambda w: [
            "compare",
            w.run_a,
            _b_with_clip(w, "small", lambda f: f[:, :32, :32], True),
            "-o",
            w.root / "r_small",
            "--device",
            "cpu",
            "--quiet",
            "--no-temporal",
        ],
        _pan_not_compared("not comparable", "is 8 frames of 64x64", "is 8 frames of 32x32"),
    ),
    E(
        "compare",
        "b-clip-unlike-its-manifest",
        lambda w: [
            "compare",
            w.run_a,
            _b_with_clip(w, "liar", lambda f: f[:5], False),
            "-o",
            w.root / "r_liar",
            "--device",
            "cpu",
            "--quiet",
            "--no-temporal",
        ],
        "job pan-",
        "runs/cpu/clips/pan-",
        "bad_b/liar/cpu_dtype-bf16/clips/pan-",
        "do not pair frame by frame",
        "5 frames, expected 8",
        "metrics --align shortest",
        process=True,
    ),
    S(
        "compare",
        "prompt-with-a-carriage-return",
        lambda w: [
            "compare",
            *_evil_prompt_runs(w),
            "-o",
            w.root / "r_evil",
            "--device",
            "cpu",
            "--quiet",
            "--no-temporal",
        ],
        _report_csvs_safe,
    ),
    E(
        "compare",
        "gate-missing",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.root / "r", "--gate", w.root / "nothere.yaml"],
        "nothere.yaml",
        "file not found",
    ),
    E(
        "compare",
        "gate-bound-nan",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "nan", "lpips: {mean: {max: .nan}}\n"),
        ],
        "nan.yaml",
        "field 'lpips.mean.max'",
        "finite number",
        "found nan",
        process=True,
    ),
    E(
        "compare",
        "gate-bound-inf",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "inf", "psnr: {mean: {min: -.inf}}\n"),
        ],
        "inf.yaml",
        "field 'psnr.mean.min'",
        "finite number",
    ),
    E(
        "compare",
        "gate-bound-string",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "str", "lpips: {mean: {max: '0.1'}}\n"),
        ],
        "str.yaml",
        "field 'lpips.mean.max'",
        "expected a number",
    ),
    E(
        "compare",
        "gate-unknown-metric",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "metric", "lpipz: {mean: {max: 1}}\n"),
        ],
        "metric.yaml",
        "field 'lpipz'",
        "unknown metric",
    ),
    E(
        "compare",
        "gate-unknown-aggregate",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "agg", "lpips: {median: {max: 1}}\n"),
        ],
        "agg.yaml",
        "field 'lpips.median'",
        "unknown aggregate",
    ),
    E(
        "compare",
        "gate-unknown-bound",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "bound", "lpips: {mean: {below: 1}}\n"),
        ],
        "bound.yaml",
        "field 'lpips.mean.below'",
        "unknown bound",
    ),
    E(
        "compare",
        "gate-max-missing-negative",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(w, "miss", "max_missing_jobs: -1\n"),
        ],
        "miss.yaml",
        "field 'max_missing_jobs'",
        "non-negative integer",
    ),
    E(
        "compare",
        "gate-empty",
        lambda w: ["compare", w.run_a, w.run_b, "-o", w.root / "r", "--gate", _gate(w, "empty", "")],
        "empty.yaml",
        "expected a mapping",
    ),
    E(
        "compare",
        "gate-alias-bomb",
        lambda w: [
            "compare",
            w.run_a,
            w.run_b,
            "-o",
            w.root / "r",
            "--gate",
            _gate(
                w,
                "bomb",
                "a0: &a0 [1,1,1,1,1,1,1,1,1,1]\n"
                + "".join(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 8)),
            ),
        ],
        "bomb.yaml",
        "aliases expanded",
    ),
    S(
        "compare",
        "prompts-with-dollar-signs",
        lambda w: [
            "compare",
            "runs_math/cpu",
            "runs_math/cpu_dtype-bf16",
            "-o",
            "math_report",
            "--device",
            "cpu",
            "--quiet",
        ],
        _math_report_ok,
    ),
    # -- study create ----------------------------------------------------------------------
    E(
        "study create",
        "summary-nested-100000-deep",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            _deep_report(w),
            "--db",
            w.root / "deep.db",
            "--protocol",
            "abx",
        ],
        "deepreport/summary.json",
        "not a compare summary",
        process=True,
    ),
    E(
        "study create",
        "db-unknown-scheme",
        lambda w: _study(w, db="foo://bar"),
        "--db foo://bar",
        "found the scheme 'foo'",
        process=True,
    ),
    E(
        "study create",
        "db-mysql",
        lambda w: _study(w, db="mysql://u:pw@localhost/x"),
        "--db mysql://u:***@localhost/x",
        "found the scheme 'mysql'",
    ),
    E(
        "study create",
        "db-postgresql-refused",
        lambda w: _study(w, db=_pg(w)),
        "--db postgresql+psycopg://evalkit:***@127.0.0.1",
        "cannot open the database",
        "refused",
        process=True,
    ),
    E(
        "study create",
        "db-postgresql-driver-missing",
        lambda w: _study(w, db=f"postgresql+nosuchdriver://u@127.0.0.1:{w.port}/x"),
        "--db postgresql+nosuchdriver://",
        "unknown database driver",
    ),
    E(
        "study create",
        "db-url-five-slashes",
        lambda w: _study(w, db="sqlite://///:::"),
        "--db sqlite://///:::",
        "expected sqlite:///relative/path or sqlite:////absolute/path",
        "5 slashes",
        process=True,
    ),
    E(
        "study create",
        "db-url-with-a-host",
        lambda w: _study(w, db="sqlite://host/x.db"),
        "--db sqlite://host/x.db",
        "found the host 'host'",
    ),
    E(
        "study create",
        "db-folder-missing",
        lambda w: _study(w, db=w.root / "nofolder" / "s.db"),
        "--db",
        "nofolder/s.db",
        "the folder",
        "does not exist",
    ),
    E(
        "study create",
        "db-ratings-table-dropped",
        lambda w: _study(w, db=_db_with(w, "noratings", "DROP TABLE ratings")),
        "--db",
        "noratings.db",
        "a damaged study database",
        "table(s) ratings missing",
    ),
    E(
        "study create",
        "db-text-file",
        lambda w: _study(w, db=w.text),
        "--db",
        "notes.txt",
        "not an SQLite study database",
    ),
    E("study create", "db-folder", lambda w: _study(w, db=w.folder), "--db", "a_folder", "found a folder"),
    E("study create", "db-empty-string", lambda w: _study(w, db=""), "--db", "empty string"),
    E(
        "study create",
        "report-missing",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            w.root / "nothere",
            "--db",
            w.root / "new.db",
            "--protocol",
            "abx",
        ],
        "nothere",
        "report folder not found",
    ),
    E(
        "study create",
        "report-without-summary",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            w.folder,
            "--db",
            w.root / "new.db",
            "--protocol",
            "abx",
        ],
        "summary.json",
        "not found",
    ),
    E(
        "study create",
        "summary-not-json",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            _report_with(w, "notjson", raw="{"),
            "--db",
            w.root / "new.db",
            "--protocol",
            "abx",
        ],
        "summary.json",
        "not a compare summary",
    ),
    E(
        "study create",
        "summary-without-runs",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            _report_with(w, "noruns", lambda d: d.pop("runs")),
            "--db",
            w.root / "new.db",
            "--protocol",
            "abx",
        ],
        "summary.json",
        "not a compare summary",
    ),
    E(
        "study create",
        "summary-relative-run-gone",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            _report_with(w, "relative", lambda d: d["runs"]["a"].update(path="runs/elsewhere")),
            "--db",
            w.root / "new.db",
            "--protocol",
            "abx",
        ],
        "summary.json",
        "field 'runs.a.path'",
        "'runs/elsewhere' not found",
    ),
    E(
        "study create",
        "summary-nothing-compared",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            _report_with(w, "none", lambda d: d["jobs"].update(compared=[])),
            "--db",
            w.root / "new.db",
            "--protocol",
            "abx",
        ],
        "field 'jobs.compared'",
        "no compared jobs",
    ),
    E(
        "study create",
        "protocol-bogus",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            w.report,
            "--db",
            w.root / "new.db",
            "--protocol",
            "mushra",
        ],
        "argument --protocol",
        "invalid choice: 'mushra'",
    ),
    E("study create", "raters-negative", lambda w: _study(w, "--raters", "-5"), "--raters", "found -5"),
    E("study create", "margin-0", lambda w: _study(w, "--margin", "0"), "--margin", "(0, 0.5)"),
    E("study create", "margin-nan", lambda w: _study(w, "--margin", "nan"), "--margin", "found nan"),
    E(
        "study create",
        "catch-alpha-nan",
        lambda w: _study(w, "--catch-alpha", "nan"),
        "--catch-alpha",
        "found nan",
    ),
    E(
        "study create",
        "catch-alpha-unreachable",
        lambda w: _study(w, "--catch-alpha", "0.001"),
        "--catch-alpha",
        "catch trials",
    ),
    E("study create", "clips-best", lambda w: _study(w, "--clips", "best:3"), "--clips", "best:3"),
    E("study create", "clips-worst-0", lambda w: _study(w, "--clips", "worst:0"), "--clips", "worst:0"),
    E("study create", "seed-negative", lambda w: _study(w, "--seed", "-1"), "--seed", "found -1"),
    E(
        "study create",
        "media-is-a-file",
        lambda w: _study(w, "--media", w.text),
        "--media",
        "notes.txt",
        "expected a folder",
    ),
    S(
        "study create",
        "report-read-from-another-folder",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            w.root / "math_report",
            "--db",
            w.root / "math.db",
            "--protocol",
            "abx",
            "--clips",
            "sample:1",
        ],
        _study_created,
    ),
    # -- study invite ----------------------------------------------------------------------
    E(
        "study invite",
        "db-mistyped",
        lambda w: ["study", "invite", "--db", w.root / "typo.db", "--study", "1"],
        "--db",
        "typo.db",
        "no study database there",
        process=True,
    ),
    E(
        "study invite",
        "db-empty-file",
        lambda w: ["study", "invite", "--db", w.empty, "--study", "1"],
        "--db",
        "empty.db",
        "not a study database",
    ),
    E(
        "study invite",
        "db-postgresql-refused",
        lambda w: ["study", "invite", "--db", _pg(w), "--study", "1"],
        "--db postgresql+psycopg://evalkit:***@",
        "refused",
    ),
    E(
        "study invite",
        "study-unknown",
        lambda w: ["study", "invite", "--db", w.db, "--study", "9"],
        "study 9",
        "no such study",
    ),
    E(
        "study invite",
        "count-0",
        lambda w: ["study", "invite", "--db", w.db, "--study", "1", "--count", "0"],
        "--count",
        "found 0",
    ),
    E(
        "study invite",
        "count-huge",
        lambda w: ["study", "invite", "--db", w.db, "--study", "1", "--count", "100000000"],
        "--count",
        "10,000",
        "found 100000000",
    ),
    E(
        "study invite",
        "base-url-ftp",
        lambda w: ["study", "invite", "--db", w.db, "--study", "1", "--base-url", "ftp://x"],
        "--base-url",
        "'ftp://x'",
    ),
    # -- study results ---------------------------------------------------------------------
    E(
        "study results",
        "reps-0",
        lambda w: ["study", "results", "--db", w.db, "--study", "1", "--reps", "0"],
        "--reps",
        "found 0",
    ),
    E(
        "study results",
        "reps-negative",
        lambda w: ["study", "results", "--db", w.db, "--study", "1", "--reps", "-1"],
        "--reps",
        "found -1",
    ),
    E(
        "study results",
        "reps-1",
        lambda w: ["study", "results", "--db", w.db, "--study", "1", "--reps", "1"],
        "--reps",
        "found 1",
        process=True,
    ),
    E(
        "study results",
        "reps-huge",
        lambda w: ["study", "results", "--db", w.db, "--study", "1", "--reps", str(10**12)],
        "--reps",
        "100,000",
    ),
    E(
        "study results",
        "csv-is-a-folder",
        lambda w: ["study", "results", "--db", w.db, "--study", "1", "--csv", w.folder],
        "argument --csv",
        "found a folder",
    ),
    E(
        "study results",
        "db-mistyped",
        lambda w: ["study", "results", "--db", w.root / "typo.db", "--study", "1"],
        "--db",
        "typo.db",
        "no study database there",
    ),
    E(
        "study results",
        "db-text-file",
        lambda w: ["study", "results", "--db", w.text, "--study", "1"],
        "--db",
        "notes.txt",
        "not an SQLite study database",
    ),
    E(
        "study results",
        "db-ratings-table-dropped",
        lambda w: [
            "study",
            "results",
            "--db",
            _db_with(w, "noratings", "DROP TABLE ratings"),
            "--study",
            "1",
        ],
        "--db",
        "noratings.db",
        "a damaged study database",
        "table(s) ratings missing",
        process=True,
    ),
    E(
        "study results",
        "db-schema-version-abc",
        lambda w: [
            "study",
            "results",
            "--db",
            _db_with(w, "vabc", "UPDATE meta SET value = 'abc' WHERE key = 'schema_version'"),
            "--study",
            "1",
        ],
        "--db",
        "vabc.db",
        "meta.schema_version",
        "expected an integer 1-6",
        "found 'abc'",
        process=True,
    ),
    E(
        "study results",
        "db-schema-version-0",
        lambda w: [
            "study",
            "results",
            "--db",
            _db_with(w, "v0", "UPDATE meta SET value = '0' WHERE key = 'schema_version'"),
            "--study",
            "1",
        ],
        "--db",
        "v0.db",
        "meta.schema_version",
        "found '0'",
    ),
    E(
        "study results",
        "study-id-too-large",
        lambda w: ["study", "results", "--db", w.db, "--study", "99999999999999999999999"],
        "study 99999999999999999999999",
        "no such study",
        process=True,
    ),
    S(
        "study results",
        "rater-label-with-a-carriage-return",
        lambda w: [
            "study",
            "results",
            "--db",
            _evil_label_db(w),
            "--study",
            "1",
            "--csv",
            w.root / "evil.csv",
        ],
        _ratings_csv_safe,
    ),
    E(
        "study results",
        "study-not-a-number",
        lambda w: ["study", "results", "--db", w.db, "--study", "x"],
        "study x",
        "no such study",
    ),
    # -- study plan ------------------------------------------------------------------------
    E(
        "study plan",
        "clips-per-rater-0",
        lambda w: ["study", "plan", "--protocol", "abx", "--clips-per-rater", "0"],
        "argument --clips/--clips-per-rater",
        "positive integer",
        "found '0'",
        process=True,
    ),
    E(
        "study plan",
        "clips-negative",
        lambda w: ["study", "plan", "--protocol", "preference", "--clips", "-3"],
        "argument --clips",
        "found '-3'",
    ),
    E(
        "study plan",
        "margin-0.001",
        lambda w: ["study", "plan", "--protocol", "abx", "--margin", "0.001"],
        "--margin 0.001",
        "the limit is 100,000",
    ),
    E(
        "study plan",
        "margin-negative",
        lambda w: ["study", "plan", "--protocol", "abx", "--margin", "-1"],
        "--margin",
        "(0, 0.5)",
    ),
    E(
        "study plan",
        "power-1",
        lambda w: ["study", "plan", "--protocol", "abx", "--power", "1"],
        "--power",
        "(0, 1)",
    ),
    E(
        "study plan",
        "power-nan",
        lambda w: ["study", "plan", "--protocol", "abx", "--power", "nan"],
        "--power",
        "found nan",
    ),
    E(
        "study plan",
        "tie-rate-1",
        lambda w: ["study", "plan", "--protocol", "preference", "--tie-rate", "1"],
        "--tie-rate",
        "[0, 1)",
    ),
    E(
        "study plan",
        "exclusion-rate-1",
        lambda w: ["study", "plan", "--protocol", "abx", "--exclusion-rate", "1"],
        "--exclusion-rate",
        "[0, 1)",
    ),
    E(
        "study plan",
        "clip-accuracy-0.5",
        lambda w: ["study", "plan", "--protocol", "abx", "--clip-accuracy", "0.5"],
        "--clip-accuracy",
        "(0.5, 1]",
    ),
    E(
        "study plan",
        "clip-accuracy-1.5",
        lambda w: ["study", "plan", "--protocol", "abx", "--clip-accuracy", "1.5"],
        "--clip-accuracy",
        "found 1.5",
    ),
    E(
        "study plan",
        "clip-accuracy-nan",
        lambda w: ["study", "plan", "--protocol", "abx", "--clip-accuracy", "nan"],
        "--clip-accuracy",
        "found nan",
    ),
    E(
        "study plan",
        "clip-accuracy-0.51",
        lambda w: ["study", "plan", "--protocol", "abx", "--clip-accuracy", "0.51"],
        "--clip-accuracy 0.51",
        "ratings per clip",
        "the limit is 5,000",
    ),
    E(
        "study plan",
        "protocol-missing",
        lambda w: ["study", "plan"],
        "the following arguments are required: --protocol",
    ),
    S(
        "study plan",
        "clips-below-the-floor",
        lambda w: ["study", "plan", "--protocol", "abx", "--clips", "5"],
        _plan_ok,
    ),
    # -- serve -----------------------------------------------------------------------------
    E(
        "serve",
        "port-99999",
        lambda w: ["serve", "--db", w.db, "--port", "99999"],
        "argument --port",
        "1-65535",
        "found '99999'",
        process=True,
    ),
    E("serve", "port-0", lambda w: ["serve", "--db", w.db, "--port", "0"], "argument --port", "found '0'"),
    E(
        "serve",
        "port-negative",
        lambda w: ["serve", "--db", w.db, "--port", "-1"],
        "argument --port",
        "found '-1'",
    ),
    E(
        "serve",
        "port-text",
        lambda w: ["serve", "--db", w.db, "--port", "http"],
        "argument --port",
        "found 'http'",
    ),
    E(
        "serve",
        "db-unknown-scheme",
        lambda w: ["serve", "--db", "foo://bar", "--port", _free_port()],
        "--db foo://bar",
        "found the scheme 'foo'",
    ),
    E(
        "serve",
        "db-mysql",
        lambda w: ["serve", "--db", "mysql://u@localhost/x", "--port", _free_port()],
        "--db mysql://u@localhost/x",
        "found the scheme 'mysql'",
    ),
    E(
        "serve",
        "db-postgresql-refused",
        lambda w: ["serve", "--db", _pg(w), "--port", _free_port()],
        "--db postgresql+psycopg://evalkit:***@",
        "refused",
    ),
    E(
        "serve",
        "db-text-file",
        lambda w: ["serve", "--db", w.text, "--port", _free_port()],
        "--db",
        "notes.txt",
        "not an SQLite study database",
        process=True,
    ),
    E(
        "serve",
        "db-folder",
        lambda w: ["serve", "--db", w.folder, "--port", _free_port()],
        "--db",
        "a_folder",
        "found a folder",
    ),
    E(
        "serve",
        "db-schema-version-abc",
        lambda w: [
            "serve",
            "--db",
            _db_with(w, "vabc", "UPDATE meta SET value = 'abc' WHERE key = 'schema_version'"),
            "--port",
            _free_port(),
        ],
        "--db",
        "vabc.db",
        "meta.schema_version",
        "found 'abc'",
        process=True,
    ),
    E(
        "serve",
        "db-ratings-table-dropped",
        lambda w: ["serve", "--db", _db_with(w, "noratings", "DROP TABLE ratings"), "--port", _free_port()],
        "--db",
        "noratings.db",
        "table(s) ratings missing",
    ),
    E(
        "serve",
        "db-mistyped",
        lambda w: ["serve", "--db", w.root / "typo.db", "--port", _free_port()],
        "--db",
        "typo.db",
        "no study database there",
    ),
    # -- issue 47: what the reliability sweep found ------------------------------------------
    E(
        "gate",
        "aggregate-a-string",
        lambda w: [
            "gate",
            _report_with(w, "aggstr", _set_aggregate("x")),
            "--gate",
            _gate(w, "lp", LPIPS_GATE),
        ],
        "aggstr/summary.json",
        "field 'aggregates.lpips.mean'",
        "expected a number or null",
        "found str 'x'",
        process=True,
    ),
    E(
        "gate",
        "aggregate-an-object",
        lambda w: [
            "gate",
            _report_with(w, "aggobj", _set_aggregate({"a": 1})),
            "--gate",
            _gate(w, "lp", LPIPS_GATE),
        ],
        "aggobj/summary.json",
        "field 'aggregates.lpips.mean'",
        "found dict",
    ),
    E(
        "gate",
        "aggregates-of-a-metric-a-list",
        lambda w: [
            "gate",
            _report_with(w, "agglist", lambda d: d["aggregates"].update(lpips=[1, 2])),
            "--gate",
            _gate(w, "lp", LPIPS_GATE),
        ],
        "field 'aggregates.lpips'",
        "found list",
    ),
    E(
        "gate",
        "summary-field-nested-100000-deep",
        lambda w: ["gate", _deep_field(w, "deepfield"), "--gate", _gate(w, "lp", LPIPS_GATE)],
        "deepfield/summary.json",
        "nested too deep",
        process=True,
    ),
    E(
        "gate",
        "summary-nested-100000-deep",
        lambda w: ["gate", _deep_report(w), "--gate", _gate(w, "lp", LPIPS_GATE)],
        "deepreport/summary.json",
        "nested too deep",
    ),
    E(
        "render",
        "diffusers-variant-empty",
        lambda w: _render(w, "-r", "diffusers", "-O", "model=m", "-O", "variant="),
        "renderer 'diffusers'",
        "option variant",
        "found an empty value",
    ),
    S(
        "render",
        "import-rgba-frames-with-a-transparent-pixel",
        lambda w: _import(w, "rgba", lambda stem, f: _rgba_frames(stem, f, opaque=False)),
        _job_failed("import of job pan-", "frame 2 (00002.png, RGBA) is transparent", "flatten the clip"),
        code=1,
    ),
    S(
        "render",
        "import-ffv1-with-alpha",
        lambda w: _import(w, "bgra", _alpha_mkv),
        _job_failed("import of job pan-", "frame 2 (bgra) is transparent"),
        code=1,
    ),
    S(
        "render",
        "import-opaque-rgba-frames",
        lambda w: _import(w, "rgba_opaque", lambda stem, f: _rgba_frames(stem, f, opaque=True)),
        _rendered,
    ),
    E(
        "floor",
        "clip-fails-its-hash",
        _floor_of_a_changed_clip,
        "hash_changed/cpu/clips/pan-",
        "clip fails its hash",
        "re-render it",
        process=True,
    ),
    E(
        "floor",
        "out-is-a-file",
        lambda w: ["floor", w.run_a, "--out", w.text],
        "argument --out",
        "found a file",
        "notes.txt",
        process=True,
    ),
    E(
        "study create",
        "excerpt-1e308",
        lambda w: _study(w, "--excerpt", "1e308"),
        "--excerpt",
        "at most 604800",
        "found '1e308'",
        process=True,
    ),
    E(
        "study create",
        "excerpt-at-1e308",
        lambda w: _study(w, "--excerpt", "0.1", "--excerpt-at", "1e308"),
        "--excerpt-at",
        "at most 604800",
        "found '1e308'",
    ),
    E(
        "study create",
        "summary-schema-version-99",
        lambda w: [
            "study",
            "create",
            "--allow-masking",
            _report_with(w, "v99", lambda d: d.update(schema_version=99)),
            "--db",
            w.root / "v99.db",
            "--protocol",
            "abx",
        ],
        "v99/summary.json",
        "field 'schema_version'",
        "unsupported version 99",
        process=True,
    ),
    E(
        "metrics",
        "temporal-on-2x2-clips",
        lambda w: ["metrics", *_tiny_clips(w, 2, 2), "--device", "cpu", "--flow", "dis"],
        "frames: 2x2",
        "OpenCV's dis optical flow",
        "--no-temporal",
        process=True,
    ),
    E(
        "metrics",
        "temporal-on-64x1-clips",
        lambda w: ["metrics", *_tiny_clips(w, 64, 1), "--device", "cpu", "--flow", "dis"],
        "frames: 64x1",
        "optical flow",
    ),
    E(
        "metrics",
        "temporal-on-2048x16-clips",
        lambda w: ["metrics", *_tiny_clips(w, 2048, 16), "--device", "cpu", "--flow", "dis"],
        "frames: 2048x16",
        "optical flow",
    ),
    E(
        "metrics",
        "farneback-on-2x2-clips",
        lambda w: ["metrics", *_tiny_clips(w, 2, 2), "--device", "cpu", "--flow", "farneback"],
        "frames: 2x2",
        "too small for LPIPS-alex",
    ),
]

ROW_IDS = [f"{r.group}: {r.id}" for r in ROWS]
assert len(set(ROW_IDS)) == len(ROW_IDS), "row ids must be unique"
STDERR: dict[str, str] = {}  # row id -> what it printed on stderr (for the last test)


@pytest.fixture(scope="module")
def math_runs(w):
    """Renders whose prompts hold mathtext ($$, $\\foo{), in runs_math/ under the work folder;
    compare is then run from there with relative paths (the report must store absolute ones)."""
    from evalkit.render.driver import render_suite

    suite = _suite(w, "math", HEAD + CLIPS + 'prompts: ["cost $$ here", "$\\\\foo{ x"]\nseeds: [0]\n')
    render_suite(
        suite,
        ["cpu", "cpu,dtype=bf16"],
        w.root / "runs_math",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )
    return w.root / "runs_math"


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_bad_input(row, w, cli, request, monkeypatch):
    if row.id in ("prompts-with-dollar-signs", "report-read-from-another-folder"):
        request.getfixturevalue("math_runs")
        if row.id == "prompts-with-dollar-signs":
            monkeypatch.chdir(w.root)  # relative run paths, as a user types them
        else:
            if not (w.root / "math_report").exists():  # the row above was not selected
                monkeypatch.chdir(w.root)
                code, _, err = cli(
                    "compare",
                    "runs_math/cpu",
                    "runs_math/cpu_dtype-bf16",
                    "-o",
                    "math_report",
                    "--device",
                    "cpu",
                    "--quiet",
                )
                assert code == 0, err
            monkeypatch.chdir(w.folder)  # somewhere else
    if row.in_root:
        monkeypatch.chdir(w.root)
    args = row.argv(w)
    code, out, err = cli(*args)
    STDERR[f"{row.group}: {row.id}"] = err
    assert "Traceback" not in err
    assert code == row.code, (code, out, err)
    if row.check is not None:
        row.check(w, out, err)
    else:
        assert_one_line_error(err, *row.needles)
        # the length of what the message says, not of the test's temporary paths in it
        said = err.replace(str(w.root), "ROOT")
        assert len(said) < 400, f"error line of {len(said)} characters"


PROCESS_ROWS = [r for r in ROWS if r.process]


@pytest.mark.slow  # a process per row (the same rows run in-process in test_bad_input)
@pytest.mark.parametrize("row", PROCESS_ROWS, ids=[f"{r.group}: {r.id}" for r in PROCESS_ROWS])
def test_rows_as_real_processes(row, w):
    """The same rows through the real entry point: nothing else on stderr (no warnings, no
    traceback from an import), exit code 2."""
    r = run_evalkit(*row.argv(w), env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}, timeout=120)
    assert r.returncode == row.code, r.stderr
    assert_one_line_error(r.stderr, *row.needles)


def test_no_row_printed_a_traceback():
    """Runs last (file order): whatever the rows printed on stderr holds no traceback."""
    if not STDERR:
        pytest.skip("no row ran in this session")
    bad = {k: v for k, v in STDERR.items() if "Traceback" in v or 'File "' in v}
    assert not bad, f"rows that printed a traceback: {sorted(bad)}"


def test_one_row_per_listed_case_and_the_count_in_the_docs():
    """docs/formats.md states how many rows this suite has."""
    from conftest import ROOT

    doc = (ROOT / "docs" / "formats.md").read_text()
    assert f"{len(ROWS)} rows" in doc, f"docs/formats.md should say '{len(ROWS)} rows'"
