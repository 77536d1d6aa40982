"""Issue 46 item 6: every clip's plot on the same axes, with its floor band drawn (an autoscaled
plot of noise looked like crf 32). Read back from the PNGs' pixels."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from conftest import DATASETS
from PIL import Image

from evalkit.compare.aggregate import aggregate
from evalkit.compare.clips import compare_clips
from evalkit.compare.run import compare_runs
from evalkit.fsutil import sha256_file
from evalkit.render.driver import render_suite

SMOKE = DATASETS / "smoke" / "suite.yaml"
INVERT = "evalkit.testing.renderers:Invert"
RED = np.array([0xC0, 0x39, 0x2B])  # the LPIPS curve
BLUE = np.array([0x24, 0x71, 0xA3])  # the SSIM curve
BAND = np.array([223, 226, 227])  # FLOOR_COLOR at alpha 0.25 over white


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A against bf16 (quiet: below the seed floor), and against a B whose second clip is the
    seed+1 render (loud); both with the seed floor; and A against bf16 with no floor."""
    root = tmp_path_factory.mktemp("plots")
    opts = {"noise": "32"}
    render_suite(SMOKE, ["cpu", "cpu,dtype=bf16"], root, renderer=INVERT, options=opts, progress=False)
    render_suite(SMOKE, ["cpu"], root, renderer=INVERT, options=opts, seed_offset=1, progress=False)
    a, b, seed = root / "cpu", root / "cpu_dtype-bf16", root / "cpu_seed+1"
    mixed = shutil.copytree(b, root / "mixed")
    m = json.loads((mixed / "manifest.json").read_text())
    s = json.loads((seed / "manifest.json").read_text())
    loud = m["jobs"][1]
    src = next(j for j in s["jobs"] if j["id"] == loud["id"])
    shutil.copyfile(seed / src["output"]["path"], mixed / loud["output"]["path"])
    loud["output"]["sha256"] = sha256_file(mixed / loud["output"]["path"])
    (mixed / "manifest.json").write_text(json.dumps(m, indent=2))
    out = {}
    for name, run_b, floors in (("quiet", b, [seed]), ("mixed", mixed, [seed]), ("floor", b, [])):
        out[name] = compare_runs(a, run_b, root / "reports" / name, floors=floors, progress=False, offset=0)
    out["jobs"] = [j["id"] for j in m["jobs"]]
    out["runs"] = {"a": a, "seed": seed}
    return out


def _clip_of(run, job: str):
    m = json.loads((run / "manifest.json").read_text())
    return run / next(j for j in m["jobs"] if j["id"] == job)["output"]["path"]


def _area(img: np.ndarray, colour: np.ndarray, tol: int = 3) -> int:
    """Pixels of the plot area of ``colour`` (a band is thousands; antialiased text, a few)."""
    return int((np.abs(img[:, 100:600].astype(int) - colour).max(axis=2) <= tol).sum())


def _png(report, summary_job: str) -> np.ndarray:
    res = report
    i = [m.pair.job_id for m in res.measures].index(summary_job)
    return np.asarray(Image.open(res.out / "img" / f"job{i:04d}_timeline.png").convert("RGB"))


def _rows_of(img: np.ndarray, colour: np.ndarray, tol: int) -> np.ndarray:
    """Rows of the plot area (not the axis labels, coloured too) holding ``colour``."""
    img = img[:, 100:600]
    hit = np.abs(img.astype(int) - colour).max(axis=2) <= tol
    return np.nonzero(hit.any(axis=1))[0]


def test_plots_share_axes_so_a_quiet_clip_looks_quiet(reports):
    quiet_job, loud_job = reports["jobs"]
    q, mx = reports["quiet"], reports["mixed"]
    # the same quiet clip, the same numbers: beside another quiet clip its SSIM curve spans
    # the plot; beside a loud clip, on the axis they share, it lies flat at the top
    alone = _rows_of(_png(q, quiet_job), BLUE, 40)
    beside = _rows_of(_png(mx, quiet_job), BLUE, 40)
    assert alone.size and beside.size
    assert (beside.max() - beside.min()) * 4 < alone.max() - alone.min()
    # and on one LPIPS axis the loud clip's curve spans far more than the quiet one's
    quiet = _rows_of(_png(mx, quiet_job), RED, 40)
    loud = _rows_of(_png(mx, loud_job), RED, 40)
    assert quiet.size and loud.min() < quiet.min() - 20  # rows count down: loud is higher
    assert loud.max() - loud.min() > 4 * (quiet.max() - quiet.min())
    # the axes: above every frame's LPIPS and every floor band; one for all clips
    for res in (q, mx):
        plots = res.summary["plots"]
        top = max(r["lpips"] for m in res.measures for r in m.records)
        assert plots["lpips"][0] == 0.0 and plots["lpips"][1] >= top
        assert plots["lpips"][1] >= max(b["p95"] for b in plots["floor_bands"].values())
        assert plots["ssim"][0] <= min(r["ssim"] for m in res.measures for r in m.records)
        assert plots["frames"] == [0, 7]


def test_each_plot_draws_its_floor_band(reports):
    q = reports["quiet"]
    bands = q.summary["plots"]["floor_bands"]
    assert set(bands) == set(reports["jobs"])
    # the band is the floor job's LPIPS p95 and mean: `evalkit metrics` of A's clip against
    # the floor's says so
    eps = float(np.finfo(np.float32).eps)
    runs = reports["runs"]
    for job, band in bands.items():
        assert band["floor"] == "seed"
        clips = [_clip_of(runs[k], job) for k in ("a", "seed")]
        lp = compare_clips(*clips, keep_frames=True, offset=0)["per_frame"]["lpips"]
        agg = aggregate(lp, "lpips")
        assert math.isclose(band["p95"], agg["p95"], rel_tol=64 * eps)
        assert math.isclose(band["mean"], agg["mean"], rel_tol=64 * eps)
        img = _png(q, job)
        in_band = (np.abs(img[:, 100:600].astype(int) - BAND).max(axis=2) <= 3).sum(axis=1)
        band_rows = np.nonzero(in_band > 100)[0]  # rows the band spans across the plot
        assert _area(img, BAND) > 5000  # a shaded band, not stray pixels
        # B (bf16) is below the floor: the LPIPS curve lies inside the band
        red = _rows_of(img, RED, 40)
        assert red.min() >= band_rows.min() - 3
    html = (q.out / "index.html").read_text()
    assert "Every clip's plot is drawn on the same axes" in html
    assert "The grey band is the clip's noise floor" in html


def test_a_report_without_a_floor_has_shared_axes_and_no_band(reports):
    fl = reports["floor"]
    assert fl.summary["plots"]["floor_bands"] == {}
    for job in reports["jobs"]:
        assert _area(_png(fl, job), BAND) < 500
