"""Benchmarks measure through the product's own paths (issue 20).

A benchmark that claims a backend's behaviour (canary sensitivity, render overhead, Ray, app
load) must build that backend with the code users run: the backend spec parsed and applied by
``evalkit.render.backend`` (``parse_spec``, ``apply_backend``: dtype, TF32, deterministic
algorithms, attention, ``torch.compile``), the pipeline loaded by a renderer, jobs rendered by an
executor of ``evalkit.render.driver`` (or the ``evalkit`` CLI). The canary card's "fp32" figures
were TF32 because ``bench_canary.py`` loaded the pipeline with its own ``load_pipe(device,
dtype)``, where cuDNN's TF32 default stayed on.

So no module ``benchmarks/*.py`` may set up a device, a dtype or a numeric flag of its own.
Scanned with :mod:`ast` (strings and comments do not count):

- ``.to(...)`` given a device or dtype (a name or attribute named ``*device*``, ``*dtype*``,
  ``dev``; a ``"cuda..."``/``"cpu"``/``"mps"`` string; ``torch.<dtype>``; ``device=``/``dtype=``),
  and ``.cuda()``, ``.half()``, ``.bfloat16()``;
- any ``torch.backends.*`` (reading a flag too: what the backend set is in its fingerprint);
- ``torch.device(...)``, ``torch.set_default_dtype``, ``torch.set_default_device``,
  ``torch.set_float32_matmul_precision``, ``torch.use_deterministic_algorithms``;
- a ``torch_dtype=`` keyword, or ``dtype=torch.<...>``;
- ``load_pipeline(...)`` / ``from_pretrained(...)`` (a pipeline built outside a renderer);
- the string ``"CUBLAS_WORKSPACE_CONFIG"`` (``apply_backend`` sets it).

Metrics are not a render backend: the metric engine computes in float32 with TF32 off by its own
rule, whatever rendered (``evalkit.metrics._common.precise``; docs/metrics.md). Benchmarks reach a
metric device only through the engine: ``PairEvaluator(device=...)``, ``get_model(net,
device)``, ``resolve_device``, ``as_frames(..., device=...)``. The only exceptions are listed in
``ALLOWED`` below, each with its reason; an entry that no longer matches anything fails too, so
the list cannot outgrow the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the benchmarks' own runs

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

#: (file name, function qualname) -> why it may set up a device/dtype itself (functions nested
#: in it included)
ALLOWED: dict[tuple[str, str], str] = {
    ("bench_metrics.py", "run_naive"): (
        "the naive baseline that the metric engine is measured against is by definition not the "
        "product's path: the reference `lpips` package's model and inputs are placed by hand on "
        "the device the engine resolved (resolve_device), on PyTorch's numeric defaults; it is a "
        "metric baseline, not a render backend, and claims nothing about one"
    ),
    ("bench_flow.py", "on_device"): (
        "test frames (luma planes or RGB batches) moved to the metric device the engine resolved "
        "(resolve_device) to time and check the torch flow; no dtype or numeric flag is set here "
        "(the flow computes in float32 under evalkit.metrics._common.precise)"
    ),
    ("bench_flow.py", "part_lpips"): (
        "LPIPS variants measured against today's metric engine and the reference `lpips` "
        "package: frames and the package's model placed on the metric device the engine resolved "
        "(resolve_device), each variant run under evalkit.metrics._common.precise; a metric baseline, not "
        "a render backend"
    ),
}

DTYPE_NAMES = {"float16", "half", "bfloat16", "float32", "float", "float64", "double"}
TORCH_CALLS = {
    "device",
    "set_default_dtype",
    "set_default_device",
    "set_float32_matmul_precision",
    "use_deterministic_algorithms",
}
CAST_METHODS = {"cuda", "half", "bfloat16"}
PIPELINE_LOADERS = {"load_pipeline", "from_pretrained"}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _is_device_or_dtype(node) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(":")[0] in ("cuda", "cpu", "mps")
    name = _dotted(node)
    if not name:
        return False
    last = name.split(".")[-1].lower()
    if name.startswith("torch.") and last in DTYPE_NAMES:
        return True
    return "device" in last or "dtype" in last or last == "dev"


class _Scanner(ast.NodeVisitor):
    def __init__(self):
        self.stack: list[str] = []
        self.found: list[tuple[int, str, str]] = []  # (line, qualname, what)

    def _add(self, node, what: str) -> None:
        self.found.append((node.lineno, ".".join(self.stack) or "<module>", what))

    def _scope(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Attribute(self, node):
        name = _dotted(node)
        if name.startswith("torch.backends.") and not isinstance(
            getattr(node, "_parent", None), ast.Attribute
        ):
            self._add(node, name)
        for child in ast.iter_child_nodes(node):
            child._parent = node
        self.generic_visit(node)

    def visit_Constant(self, node):
        if node.value == "CUBLAS_WORKSPACE_CONFIG":
            self._add(node, "CUBLAS_WORKSPACE_CONFIG")

    def visit_Call(self, node):
        func = node.func
        name = _dotted(func)
        attr = (
            func.attr if isinstance(func, ast.Attribute) else (func.id if isinstance(func, ast.Name) else "")
        )
        if attr == "to" and isinstance(func, ast.Attribute):
            args = list(node.args) + [k.value for k in node.keywords if k.arg in ("device", "dtype")]
            if any(_is_device_or_dtype(a) for a in args) or any(
                k.arg in ("device", "dtype") for k in node.keywords
            ):
                self._add(node, f".to({ast.unparse(node.args[0]) if node.args else '...'})")
        elif attr in CAST_METHODS and isinstance(func, ast.Attribute) and not node.args:
            self._add(node, f".{attr}()")
        if name.startswith("torch.") and name.split(".", 1)[1] in TORCH_CALLS:
            self._add(node, name + "()")
        if attr in PIPELINE_LOADERS:
            self._add(node, attr + "()")
        for k in node.keywords:
            if k.arg == "torch_dtype" or (k.arg == "dtype" and _dotted(k.value).startswith("torch.")):
                self._add(node, f"{k.arg}={ast.unparse(k.value)}")
        self.generic_visit(node)


def scan_source(text: str) -> list[tuple[int, str, str]]:
    tree = ast.parse(text)
    s = _Scanner()
    s.visit(tree)
    return sorted(set(s.found))


def allowed(name: str, qual: str) -> bool:
    return any(name == f and (qual == q or qual.startswith(q + ".")) for f, q in ALLOWED)


def bench_files() -> list[Path]:
    return sorted(BENCH.glob("*.py"))


def test_scanner_flags_own_backend_setup():
    """The scanner itself: each pattern is found, and where."""
    src = """
import torch
def load_pipe(device, dtype):
    pipe = Pipeline.from_pretrained("m", torch_dtype=dtype)
    pipe.to(device)
    x = t.to(self.device).to(torch.float16)
    y = t.to("cuda:0")
    z = t.cuda().half()
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    return torch.device("cuda"), load_pipeline("m", dtype=torch.bfloat16)
class A:
    def f(self):
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        return torch.backends.cuda.matmul.allow_tf32
"""
    found = scan_source(src)
    what = [w for _, _, w in found]
    for expected in (
        "from_pretrained()",
        "torch_dtype=dtype",
        ".to(device)",
        ".to(self.device)",
        ".to(torch.float16)",
        ".to('cuda:0')",
        ".cuda()",
        ".half()",
        "torch.backends.cudnn.allow_tf32",
        "torch.set_float32_matmul_precision()",
        "torch.device()",
        "load_pipeline()",
        "dtype=torch.bfloat16",
        "CUBLAS_WORKSPACE_CONFIG",
        "torch.backends.cuda.matmul.allow_tf32",
    ):
        assert expected in what, (expected, found)
    assert {q for _, q, _ in found} == {"load_pipe", "A.f"}
    # the product's path and data conversions are not flagged
    clean = """
from evalkit.render.backend import apply_backend, parse_spec
with apply_backend(parse_spec("cuda,dtype=bf16")) as runtime:
    renderer.load(runtime)
x = torch.from_numpy(a).float() / 255
y = np.arange(4, dtype=np.float32)
z = frames.astype(np.uint8).to_numpy() if False else t.to(memory_format=torch.channels_last)
"""
    assert scan_source(clean) == []


@pytest.mark.parametrize("path", bench_files(), ids=lambda p: p.name)
def test_benchmark_sets_up_no_backend_of_its_own(path):
    found = [(line, q, w) for line, q, w in scan_source(path.read_text()) if not allowed(path.name, q)]
    assert not found, (
        f"{path.relative_to(ROOT)} sets up a device, dtype or numeric flag itself "
        f"(build the backend with evalkit.render.backend / a renderer / an executor, or reach a "
        f"metric device through the metric engine; see this test's docstring): "
        + "; ".join(f"line {line} in {q}: {w}" for line, q, w in found)
    )


def test_allow_list_is_small_explained_and_used():
    assert len(ALLOWED) <= 3
    for (name, qual), reason in ALLOWED.items():
        assert len(reason.split()) >= 15, f"{name}:{qual}: give the reason"
        path = BENCH / name
        assert path.is_file(), f"ALLOWED names a missing file {name}"
        hits = [w for _, q, w in scan_source(path.read_text()) if q == qual or q.startswith(qual + ".")]
        assert hits, f"ALLOWED[{name}, {qual}] matches nothing any more: remove it"


def test_backend_benchmarks_build_backends_through_evalkit():
    """Benchmarks that take a backend spec render through evalkit.render (or the CLI)."""
    for path in bench_files():
        text = path.read_text()
        if "--backend" not in text:
            continue
        tree = ast.parse(text)
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported & {"evalkit.render.backend", "evalkit.render.driver", "evalkit.cli"}, (
            f"{path.name} takes --backend but imports no backend machinery"
        )


def _bench_canary():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_canary", BENCH / "bench_canary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_canary_renders_what_evalkit_render_writes(tmp_path):
    """bench_canary's frames are those of `evalkit render` (the run folder's lossless clips)."""
    import numpy as np

    from evalkit.formats.run import RunDir
    from evalkit.formats.suite import load_suite
    from evalkit.render.driver import render_suite
    from evalkit.render.sources import SourceCache
    from evalkit.video import ClipReader

    bench = _bench_canary()
    suite_path = ROOT / "datasets/smoke/suite.yaml"
    suite = load_suite(suite_path)
    job = suite.jobs[0]
    [summary] = render_suite(suite_path, ["cpu,dtype=bf16"], tmp_path, jobs=[job.id], progress=False)
    assert summary.failed == 0 and summary.done == 1
    ours = bench.render_jobs("cpu,dtype=bf16", bench.REPO / "models/canary", [job], SourceCache(suite))
    run = RunDir.open(summary.path)
    for job in [job]:
        written = ClipReader(run.path / run.job(job.id)["output"]["path"]).read()
        assert np.array_equal(ours[job.id].frames, written), job.id


def test_bench_canary_sensitivity_smoke(tmp_path):
    """The CPU path of the sensitivity benchmark on the smoke suite's first job (8 frames of
    64x64, cut to 4): a re-render of each backend, and the seed floor."""
    import json

    bench = _bench_canary()
    out = tmp_path / "sens.json"
    assert (
        bench.main(
            [
                "sensitivity",
                "-b",
                "cpu,dtype=bf16",
                "--suite",
                str(ROOT / "datasets/smoke/suite.yaml"),
                "--jobs",
                "astronaut_pan",
                "--max-frames",
                "4",
                "--seed-floor",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["reference"] == "cpu" and res["backends"] == ["cpu,dtype=bf16"]
    fp = res["runs"]["cpu,dtype=bf16"]["fingerprint"]
    assert fp["dtype"] == "bf16" and fp["deterministic_algorithms"] is True
    pairs = res["pairs"]
    for spec in ("cpu", "cpu,dtype=bf16"):
        rr = pairs[f"{spec} (re-render) vs {spec}"]
        assert rr["identical_frames"] == rr["frames"] == 4
    cross = pairs["cpu,dtype=bf16 vs cpu"]
    assert cross["identical_frames"] < 4
    assert 0 < cross["aggregates"]["lpips"]["mean"] < 0.01
    assert 0 < cross["floor_ratio"]["lpips"]["mean"] < 0.2
