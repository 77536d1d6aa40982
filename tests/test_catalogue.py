"""The metric catalogue (evalkit.metrics.catalogue) is the one list of metric keys: it matches what the
stream evaluator produces, its directions match the aggregate and ratio rules, and no other
module keeps a list of its own."""

from __future__ import annotations

import ast
import csv
import math

import numpy as np
import pytest
from conftest import ROOT

from evalkit.metrics import catalogue
from evalkit.metrics.catalogue import KEYS, METRICS, fmt, keys

pytestmark = pytest.mark.filterwarnings("ignore:.*(pretrained|weight enum).*:UserWarning")


def random_clips(n=5, h=32, w=48, seed=0):
    """Two (n, h, w, 3) uint8 clips: smooth random content, b a noisy copy of a."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (n, h // 4, w // 4, 3)).astype(np.float64)
    a = np.repeat(np.repeat(base, 4, axis=1), 4, axis=2)
    b = np.clip(a + rng.normal(0, 8, a.shape), 0, 255)
    return a.astype(np.uint8), b.astype(np.uint8)


def metric_keys_in_order(records) -> list[str]:
    seen = []
    for r in records:
        seen += [k for k in r if k not in ("frame", "identical") and k not in seen]
    return seen


@pytest.fixture(scope="module")
def evaluated():
    from evalkit.metrics.stream import evaluate_pair

    a, b = random_clips()
    return {t: evaluate_pair(iter(a), iter(b), device="cpu", chunk=2, temporal=t) for t in (True, False)}


# -- the catalogue against what the evaluator produces ----------------------------------------


@pytest.mark.parametrize("temporal", [True, False])
def test_catalogue_keys_are_the_columns_the_stream_evaluator_produces(evaluated, temporal):
    res = evaluated[temporal]
    expected = list(keys(optional=False) if temporal else keys(temporal=False, optional=False))
    assert metric_keys_in_order(res["records"]) == expected
    assert list(res["means"]) == expected
    for k in expected:  # each key exists from its first frame on, and never before
        frames = [r["frame"] for r in res["records"] if k in r]
        assert frames == list(range(METRICS[k].first_frame, len(res["records"]))), k


def test_keys_and_units_agree():
    from evalkit.metrics.stream import FIDELITY_KEYS, TEMPORAL_KEYS, UNITS

    assert len(set(KEYS)) == len(KEYS) == 15
    assert tuple(METRICS) == KEYS and all(m.key == k for k, m in METRICS.items())
    # the stream evaluator makes every key but the optional ones (vmaf: evalkit.metrics.vmaf's
    # pass; block_psnr: evalkit compare's, evalkit.compare.local)
    assert FIDELITY_KEYS + TEMPORAL_KEYS == keys(optional=False)
    assert keys(optional=True) == ("block_psnr", "vmaf")
    assert list(UNITS) == list(KEYS) == list(catalogue.units())
    assert keys(temporal=False, optional=False) + keys(temporal=True) + keys(optional=True) == KEYS
    assert all(m.temporal == (m.first_frame > 0) for m in METRICS.values())
    for m in METRICS.values():
        assert m.direction in (catalogue.HIGHER, catalogue.LOWER)
        assert m.name and m.unit and m.description and "\n" not in m.description
    with pytest.raises(KeyError, match="unknown metric 'nope'"):
        catalogue.metric("nope")


@pytest.mark.parametrize("temporal", [True, False])
def test_metrics_csv_columns_follow_the_catalogue(evaluated, tmp_path, temporal):
    from evalkit.compare.clips import write_csv

    write_csv(tmp_path / "f.csv", evaluated[temporal]["records"])
    with open(tmp_path / "f.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == ["frame", *(keys(optional=False) if temporal else keys(temporal=False, optional=False))]


# -- directions, aggregates and floor ratios --------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_directions_agree_with_the_aggregate_rules(key):
    from evalkit.compare.aggregate import aggregate

    m = METRICS[key]
    assert m.higher_is_better == catalogue.higher_is_better(key) == (m.direction == "higher")
    assert m.p95_percentile == (5.0 if m.higher_is_better else 95.0)
    assert m.worst == ("min" if m.higher_is_better else "max")
    values = list(np.random.default_rng(1).permutation(np.arange(1.0, 101.0)))
    agg = aggregate(values + [None, math.nan], key)
    assert agg["frames"] == 100 and agg["mean"] == pytest.approx(50.5)
    # worst and p95 sit on the bad side: low values where higher is better, high ones otherwise
    assert agg["worst"] == (1.0 if m.higher_is_better else 100.0)
    assert agg["p95"] == pytest.approx(np.percentile(values, 5 if m.higher_is_better else 95))
    assert (agg["p95"] < agg["mean"]) == m.higher_is_better


def test_similarity_metrics_are_the_higher_is_better_ones():
    assert keys(higher_is_better=True) == ("ssim", "psnr", "block_psnr", "vmaf")
    assert set(keys(higher_is_better=False)) == set(KEYS) - {"ssim", "psnr", "block_psnr", "vmaf"}


@pytest.mark.parametrize("key", keys(ratio=True))
def test_floor_ratios_measure_badness_and_follow_the_catalogue(key):
    from evalkit.compare.aggregate import floor_ratio

    m = METRICS[key]
    good, bad = (0.9, 0.8) if key == "ssim" else (40.0, 30.0) if key in ("psnr", "block_psnr") else (0.1, 0.2)
    assert (good > bad) == m.higher_is_better
    # the ratio's operand grows as the metric gets worse, whatever the direction
    assert m.ratio_operand(bad) > m.ratio_operand(good) >= 0
    assert m.ratio_operand(None) is None
    r = floor_ratio(
        {key: {"mean": bad, "p95": None, "worst": good}}, {key: {"mean": good, "p95": good, "worst": good}}
    )
    assert list(r) == [key] and list(r[key]) == list(catalogue.AGGREGATES)
    assert r[key]["mean"] == pytest.approx(m.ratio_operand(bad) / m.ratio_operand(good))
    assert r[key]["mean"] > 1 and r[key]["p95"] is None and r[key]["worst"] == pytest.approx(1)


def test_ratio_definitions():
    assert keys(ratio=True) == ("lpips", "ssim", "psnr", "tlp", "tof", "flicker", "block_psnr")
    assert METRICS["ssim"].ratio_operand(0.99) == pytest.approx(0.01)
    assert METRICS["psnr"].ratio_operand(20.0) == pytest.approx(0.01)  # the MSE / peak^2
    assert METRICS["psnr"].ratio_operand(math.inf) == 0.0
    with pytest.raises(ValueError):
        METRICS["max_abs_diff"].ratio_operand(1.0)
    # a gate checks metrics that compare a with b; the *_a / *_b ones describe one clip
    assert set(KEYS) - set(keys(compares=True)) == {"warp_error_a", "warp_error_b", "flicker_a", "flicker_b"}
    assert set(keys(ratio=True)) <= set(keys(compares=True))


# -- one list only --------------------------------------------------------------------------


def _literal_key_lists(path):
    """(line, strings) of every literal list/tuple/set in ``path`` that lists metric keys (it
    holds "lpips" and "ssim", or three or more strings that are all metric keys), and of every
    dict literal keyed by three or more metric keys and nothing else. ``__all__`` (names of
    functions, some called lpips and ssim) is not a list of metric keys."""
    tree = ast.parse(path.read_text(), str(path))
    exports = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Assign, ast.AugAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "__all__"
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        )
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):  # a table keyed by metric (units, say)
            elts = node.keys
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and id(node) not in exports:
            elts = node.elts
        else:
            continue
        strings = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        named = [s for s in strings if s in METRICS]
        if (not isinstance(node, ast.Dict) and {"lpips", "ssim"} <= set(named)) or (
            len(named) >= 3 and len(named) == len(elts)
        ):
            out.append((node.lineno, strings))
    return out


def test_no_other_module_lists_metric_keys():
    own = ROOT / "metrics" / "catalogue.py"
    found = {}
    for pkg in ("evalkit", "metrics"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path != own:
                for line, strings in _literal_key_lists(path):
                    found[f"{path.relative_to(ROOT)}:{line}"] = strings
    assert found == {}, "lists of metric keys outside metrics/catalogue.py (use the catalogue)"


def test_the_list_check_finds_the_old_lists(tmp_path):
    src = tmp_path / "old.py"
    src.write_text(
        'METRIC_KEYS = ("lpips", "ssim", "psnr", "max_abs_diff", "diff_fraction")\n'
        'RATIO_METRICS = ["tlp", "tof", "flicker"]\n'
        'for key in ("lpips", "ssim", "psnr"):\n    pass\n'
        '__all__ = ["lpips", "ssim", "psnr"]\n'  # function names
        'CONVENTIONS = ("flow", "warp_error", "tlp", "tof", "flicker")\n'
        'NAN = ("warp_error_a", "warp_error_b")\n'
        'UNITS = {"tlp": "...", "tof": "...", "flicker": "..."}\n'
        'CONV = {"lpips": "v0.1", "ssim": "luma", "psnr": "rgb8", "compute": "float32"}\n'
    )
    assert [line for line, _ in _literal_key_lists(src)] == [1, 2, 3, 8]


def test_catalogue_imports_nothing_heavy():
    tree = ast.parse((ROOT / "metrics" / "catalogue.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "numbers", "dataclasses", "typing"}


# -- numbers for people and CSV text ---------------------------------------------------------


@pytest.mark.parametrize(
    "value, kw, shown",
    [
        (None, {}, "n/a"),
        (math.inf, {}, "inf"),
        (-math.inf, {}, "-inf"),
        (math.nan, {}, "nan"),
        (7.5114e-05, {}, "7.511e-05"),
        (0.0, {}, "0"),
        (1.0, {}, "1"),
        (48.2685, {}, "48.27"),
        (3, {}, "3"),
        (True, {}, "True"),
        ("x", {}, "x"),
        (np.float32(0.5), {}, "0.5"),
        (0.0001, {"digits": 4, "fixed": True}, "0.0001"),
        (48.3567, {"digits": 2, "fixed": True}, "48.36"),
        (None, {"none": "&ndash;"}, "&ndash;"),
        (math.inf, {"inf": "&infin;"}, "&infin;"),
        (48.2685, {"digits": 6}, "48.2685"),
    ],
)
def test_fmt(value, kw, shown):
    assert fmt(value, **kw) == shown


def test_csv_text_and_write_csv(tmp_path):
    from evalkit.fsutil import csv_text, write_csv

    rows = [[1, None, 0.1, "a,b"], [2, math.inf, True, ""]]
    assert csv_text(["i", "x", "y", "z"], rows) == 'i,x,y,z\n1,,0.1,"a,b"\n2,inf,True,\n'
    write_csv(tmp_path / "t.csv", ("i", "j"), [[None, 1]], lineterminator="\r\n")
    assert (tmp_path / "t.csv").read_bytes() == b"i,j\r\n,1\r\n"
