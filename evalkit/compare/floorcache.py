"""The noise floor measured once and reused (issue 46 item 5).

A floor run is compared against A by every compare that names it; a new user's compare of 320
frames spent half its time measuring the same floor again. Each floor job's measurement (its
per-frame records, summary, alignment and worst block: what compare reads of it) is kept on
disk, keyed by everything it depends on:

- the two clips' bytes: A's and the floor job's sha256 (checked against the files by
  :func:`evalkit.compare.pairing.pair_jobs` before anything is read here);
- the metric settings: the session's conventions (LPIPS net, SSIM/PSNR, flow, the compute
  device type: every metric option that changes a number, as resolved), the offset rule
  (``auto`` or frames), VMAF on/off;
- the code version of the metrics: the source of ``metrics/``, of the compare modules that
  measure (:data:`NOT_MEASURING` are left out), of the decoders (:mod:`evalkit.video`,
  :mod:`evalkit.procdecode`), and the versions of numpy, torch, PyAV, OpenCV and Triton.

Anything else changed (a clip re-rendered, ``--no-temporal``, an edited metric) is another key:
that job is measured again, the others reused. Chunk sizes and thread counts are not in the key
(they change how fast it is measured, and the numbers at most in float32 rounding: LPIPS sums on
a CPU depend on the thread count). Entries are JSON files under
``$EVALKIT_FLOOR_CACHE`` (a folder; ``off`` disables the cache), else
``$EVALKIT_CACHE_DIR/floors`` (``~/.cache/evalkit/floors``), written atomically; one that cannot
be read is measured again, one that cannot be written is only a slower next compare. Each entry
records when and for which report it was measured: the report says "floor: reused from ...".
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
from pathlib import Path

#: the floor cache's folder (``off``: no cache)
CACHE_ENV = "EVALKIT_FLOOR_CACHE"

#: the entries' format; another one is never read
FORMAT = 1

_CODE: str | None = None


def cache_root() -> Path | None:
    """The floor cache's folder, or None when ``$EVALKIT_FLOOR_CACHE`` is ``off``."""
    env = os.environ.get(CACHE_ENV)
    if env is not None and env.strip().lower() in ("off", "0", "no", "false"):
        return None
    if env:
        return Path(env).expanduser()
    from evalkit.metrics.weights import cache_dir

    return cache_dir() / "floors"


#: modules of evalkit/compare/ that only read measurements (report, gate, headline): not in
#: the code version; every other one (pairing, alignment, local blocks, VMAF...) is
NOT_MEASURING = ("report.py", "gating.py", "aggregate.py", "floorcache.py")


def code_files() -> list[Path]:
    """The source files whose code decides a floor job's numbers: ``metrics/``, the compare
    modules that measure (read as files, not imported: any of them may move), the decoders."""
    import evalkit
    import evalkit.metrics as metrics

    root = Path(evalkit.__file__).parent
    files = sorted(Path(metrics.__file__).parent.glob("*.py"))
    files += [p for p in sorted((root / "compare").glob("*.py")) if p.name not in NOT_MEASURING]
    files += [root / "video.py", root / "procdecode.py"]
    return files


def _library_versions() -> dict:
    from importlib import metadata

    out = {}
    for name in (
        "numpy",
        "torch",
        "av",
        "opencv-python",
        "opencv-python-headless",
        "opencv-contrib-python",
        "opencv-contrib-python-headless",
        "triton",
    ):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def code_version(files: list[Path] | None = None) -> str:
    """A hash of :func:`code_files` (or ``files``), evalkit's version and the libraries'
    versions: the code version of the floor's metrics."""
    global _CODE
    if files is None and _CODE is not None:
        return _CODE
    from evalkit import __version__

    h = hashlib.sha256()
    for p in files if files is not None else code_files():
        h.update(p.name.encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"<missing>")
    h.update(json.dumps({"evalkit": __version__, **_library_versions()}, sort_keys=True).encode())
    digest = h.hexdigest()[:24]
    if files is None:
        _CODE = digest
    return digest


def settings_key(conventions: dict, offset, vmaf: bool) -> dict:
    """The metric settings a floor job's numbers depend on (part of every key): the session's
    conventions (every option of :class:`evalkit.metrics.stream.PairEvaluator` that changes a
    number is in them, resolved: ``flow=auto`` and ``flow=dis`` on a CPU are one key; worker and
    autotune limits are not), the offset rule and VMAF."""
    return {"conventions": conventions, "offset": str(offset), "vmaf": bool(vmaf)}


def job_key(pair, settings: dict, code: str) -> str:
    """The cache key of one floor pair: its two clips' sha256, the settings, the code."""
    key = {
        "format": FORMAT,
        "a": pair.rec_a["output"]["sha256"],
        "floor": pair.rec_b["output"]["sha256"],
        "settings": settings,
        "code": code,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _plain(v):
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    if isinstance(v, (set, tuple)):
        return list(v)
    return str(v)


class FloorCache:
    """The floor measurements of one compare: :meth:`split` the pairs into those already
    measured (rebuilt as :class:`~evalkit.compare.pairing.JobMeasure`) and those to measure,
    :meth:`store` the new ones, :meth:`provenance` for the report."""

    def __init__(
        self,
        *,
        conventions: dict,
        offset,
        vmaf: bool,
        report,
        measure_type,
        root: Path | None = None,
        enabled: bool = True,
    ):
        #: the class of a measurement (:class:`evalkit.compare.pairing.JobMeasure`)
        self.measure_type = measure_type
        self.root = (root if root is not None else cache_root()) if enabled else None
        self.settings = settings_key(conventions, offset, vmaf)
        self.code = code_version() if self.root is not None else ""
        self.report = str(Path(report).resolve())

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def split(self, pairs) -> tuple[dict, list, dict]:
        """``(reused, todo, sources)``: job id -> a JobMeasure read from the cache, the pairs
        to measure, job id -> the reused entry's ``measured`` record."""
        reused, todo, sources = {}, [], {}
        for p in pairs:
            entry = self._load(p) if self.root is not None else None
            if entry is None:
                todo.append(p)
            else:
                reused[p.job_id] = _measure_of(self.measure_type, p, entry)
                sources[p.job_id] = entry["measured"]
        return reused, todo, sources

    def _load(self, pair) -> dict | None:
        try:
            entry = json.loads(self._path(job_key(pair, self.settings, self.code)).read_text())
            if entry.get("format") != FORMAT:
                return None
            return entry
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, measures, floor_run) -> None:
        """Keep each floor JobMeasure of this compare, measured from ``floor_run`` (skipped
        where the cache cannot be written)."""
        if self.root is None:
            return
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        for m in measures:
            al = m.alignment
            entry = {
                "format": FORMAT,
                "job": m.pair.job_id,
                "measured": {
                    "at": now,
                    "report": self.report,
                    "floor_run": str(floor_run),
                    "code": self.code,
                },
                "records": m.records,
                "summary": m.summary,
                "worst_frame": m.worst_frame,
                "alignment": None
                if al is None
                else {
                    "finding": al.finding,
                    "offset": al.offset,
                    "mad": [[k, v] for k, v in al.mad.items()],
                    "motion": al.motion,
                    "frames": al.frames,
                    "reason": al.reason,
                },
                "local": m.local,
            }
            try:
                text = json.dumps(entry, default=_plain)  # inf/nan as JSON5 words: read back
                path = self._path(job_key(m.pair, self.settings, self.code))
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, path)
            except (OSError, TypeError, ValueError):
                continue

    def provenance(self, name: str, pairs, sources: dict) -> dict:
        """summary.json's ``floors[name]["cache"]``: jobs reused and measured, where from, and
        the line compare prints."""
        reused = [p.job_id for p in pairs if p.job_id in sources]
        measured = [p.job_id for p in pairs if p.job_id not in sources]
        froms = sorted({(s["at"], s["report"]) for s in sources.values()})
        if self.root is None:
            text = f"floor {name}: measured ({len(measured)} jobs; floor cache off)"
        elif not reused:
            text = f"floor {name}: measured ({len(measured)} jobs), kept for the next compare in {self.root}"
        else:
            where = "; ".join(f"the compare into {r} at {at}" for at, r in froms)
            text = (
                f"floor {name}: reused from {where} ({len(reused)} of {len(pairs)} jobs"
                + (f"; {len(measured)} measured again: their clips or settings changed" if measured else "")
                + f"; cache {self.root})"
            )
        return {
            "reused": reused,
            "measured": measured,
            "from": [{"at": at, "report": r} for at, r in froms],
            "dir": None if self.root is None else str(self.root),
            "text": text,
        }


def _measure_of(measure_type, pair, entry: dict):
    """A JobMeasure of ``pair`` from a cache entry (no worst-frame pixels: floors keep none)."""
    from evalkit.compare.alignment import Alignment

    al = entry.get("alignment")
    alignment = (
        None
        if al is None
        else Alignment(
            finding=al["finding"],
            offset=int(al["offset"]),
            mad={int(k): v for k, v in al["mad"]},
            motion=al["motion"],
            frames=int(al["frames"]),
            reason=al["reason"],
        )
    )
    return measure_type(
        pair,
        entry["records"],
        entry["summary"],
        int(entry["worst_frame"]),
        alignment=alignment,
        local=entry.get("local"),
    )
