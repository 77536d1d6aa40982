"""Typed models of the files a user writes or opens: the suite (``suite.yaml``), the gate
(``gate.yaml``) and the run folder's manifest (``manifest.json``); and the one formatter that
turns pydantic's errors into evalkit's one-line ``field 'clips[2].path': expected X, found Y``.

The models hold the rules (types, ranges, patterns, known keys); :mod:`.suite`, :mod:`.gate`
and :mod:`.run` read a file, check its ``schema_version`` first (an unknown version gets its
own clear error, not a list of whatever else differs), validate it with the model and build
their own objects from it. ``tools/gen_docs.py`` writes the field tables of docs/formats.md
from these models (``FORMATS``), ``Field(description=...)`` included.

Validation is strict: no coercion (``"1"`` is not 1, ``true`` is not 1; an integer is a fine
number), and unknown keys are errors that list the known ones, except in the manifest, whose
records other tools (the Ray executor) extend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from evalkit.lossless import LOSSLESS_FORMATS

SUITE_SCHEMA_VERSION = 1
MANIFEST_SCHEMA_VERSION = 1
GATE_SCHEMA_VERSION = 1
FINGERPRINT_SCHEMA_VERSION = 1
#: a compare report's summary.json (written by evalkit.compare.report, read by the study room)
SUMMARY_SCHEMA_VERSION = 1
#: a run's label (``render --label``): it names the run folder, so a folder-name-safe word
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$"
LABEL_RULE = "1-64 letters, digits, '_', '.', '+', '-', starting with a letter or digit"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
AGGREGATES = ("mean", "p95", "worst")
BOUNDS = ("max", "min")
STATUSES = ("pending", "done", "failed")

_OWN = "evalkit:"  # prefix of the error types raised here: their message is already complete


# -- turning errors into one line ------------------------------------------------------------


def found(value, *, typed: bool = True) -> str:
    """How a message shows the value it found: ``str 'seven'``, ``null``, ``an empty list``."""
    if value is None:
        return "null"
    if isinstance(value, (str, list, dict)) and not value:
        return {str: "an empty string", list: "an empty list", dict: "an empty mapping"}[type(value)]
    shown = bounded_repr(value, 60)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}" if typed else shown


def json_problem(e: Exception) -> str:
    """Why a JSON file did not parse, in words (a document nested beyond Python's recursion
    limit, e.g. 100,000 ``[``, is one case: the decoder recurses)."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e)


def bounded_repr(value, limit: int) -> str:
    """``repr(value)`` when it has at most ``limit`` characters, else a longer string that starts
    like it; never walks more of ``value`` than that takes (a value from a YAML alias bomb may
    stand for millions of items)."""
    out: list[str] = []
    size = 0

    def walk(v):
        if isinstance(v, (list, tuple)):
            yield "[" if isinstance(v, list) else "("
            for i, item in enumerate(v):
                if i:
                    yield ", "
                yield from walk(item)
            yield "]" if isinstance(v, list) else ("," if len(v) == 1 else "") + ")"
        elif isinstance(v, dict):
            yield "{"
            for i, (k, item) in enumerate(v.items()):
                yield ", " if i else ""
                yield from walk(k)
                yield ": "
                yield from walk(item)
            yield "}"
        elif isinstance(v, (str, bytes)):
            yield repr(v[: limit + 1])[:-1] if len(v) > limit else repr(v)
        else:
            yield repr(v)[: limit + 1]

    for chunk in walk(value):
        out.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return "".join(out)


def field_path(loc) -> str | None:
    """pydantic's ``('clips', 2, 'path')`` as ``clips[2].path`` (None for the whole file)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out or None


#: what a value should have been, by pydantic error type (those not here: their message)
_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "none_required": "null",
    "literal_error": "{expected}",
    "enum": "{expected}",
    "greater_than": "a value > {gt}",
    "greater_than_equal": "a value >= {ge}",
    "less_than": "a value < {lt}",
    "less_than_equal": "a value <= {le}",
    "too_short": "at least {min_length} item(s)",
    "too_long": "at most {max_length} item(s)",
    "string_too_short": "at least {min_length} character(s)",
    "string_pattern_mismatch": "text matching {pattern}",
}


def _is_type_error(err: dict) -> bool:
    return err["type"].endswith("_type")


def describe(err: dict) -> tuple[str | None, str]:
    """One pydantic error (an item of ``ValidationError.errors()``) as (field, problem)."""
    loc, kind = tuple(err["loc"]), err["type"]
    if loc and loc[-1] == "[key]":  # a mapping's key: name the mapping, show the key
        what = _EXPECTED.get(kind, "a string").removeprefix("a ").removeprefix("an ")
        return field_path(loc[:-2]), f"expected {what} keys, found {found(err['input'])}"
    field = field_path(loc)
    if kind.startswith(_OWN):
        return field, err["msg"]
    if kind == "missing":
        return field, "missing"
    if kind == "extra_forbidden":
        return field, "unknown key"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind].format(**err.get("ctx", {}))
    else:  # pydantic's own words: "Input should be X" -> "expected X"
        expected = err["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
    return field, f"expected {expected}, found {found(err['input'], typed=_is_type_error(err))}"


def first_problem(error: ValidationError) -> tuple[str | None, str]:
    """The first problem of a failed validation as (field, problem): what evalkit reports."""
    return describe(error.errors(include_url=False)[0])


def version_problem(doc: dict, supported: int, *, default: int | None = None) -> str | None:
    """What is wrong with ``doc``'s ``schema_version`` (None: it is the supported one, or it is
    absent and ``default`` is)."""
    if "schema_version" not in doc:
        return None if default == supported else f"missing (expected {supported})"
    version = doc["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        return f"expected an integer, found {found(version)}"
    if version != supported:
        return f"unsupported version {version} (this evalkit reads {supported})"
    return None


def _fail(loc: tuple, message: str, value) -> ValidationError:
    """An error at ``loc`` (relative to the value being validated) with a complete message."""
    kind = message.split(" ", 1)[0]
    return ValidationError.from_exception_data(
        "evalkit", [InitErrorDetails(type=PydanticCustomError(_OWN + kind, message), loc=loc, input=value)]
    )


# -- annotations that shape the messages -----------------------------------------------------


class Expect:
    """``Annotated`` marker: a value of the wrong type reads ``expected <what>, found <type>
    <value>``; with ``constraint``, one of the right type that breaks a constraint (range,
    pattern, length) reads ``expected <constraint>, found <value>``. Errors inside the value (an
    item of a list, a key of a mapping) keep their own place and message."""

    def __init__(self, what: str, constraint: str | None = None):
        self.what, self.constraint = what, constraint

    def __get_pydantic_core_schema__(self, source, handler):
        schema = handler(source)
        union = schema.get("type") == "union"
        return core_schema.no_info_wrap_validator_function(
            lambda v, inner: self._check(v, inner, union), schema
        )

    def _check(self, value, inner, union: bool):
        try:
            return inner(value)
        except ValidationError as e:
            errors = e.errors(include_url=False)
            own = [err for err in errors if not err["loc"] or (union and len(err["loc"]) == 1)]
            if own and all(_is_type_error(err) for err in own):
                raise PydanticCustomError(
                    _OWN + "expected", f"expected {self.what}, found {found(value)}"
                ) from None
            if own and self.constraint and not own[0]["type"].startswith(_OWN):
                raise PydanticCustomError(
                    _OWN + "expected", f"expected {self.constraint}, found {found(value, typed=False)}"
                ) from None
            raise


class Keys:
    """``Annotated`` marker for a mapping whose keys come from a list: ``choices``, or the
    validation context's ``context`` entry (when the context has it). An unknown key is an error
    at that key; ``non_empty``: an empty mapping is one too."""

    def __init__(self, noun: str, choices=None, *, context: str | None = None, non_empty=False):
        self.noun, self.choices, self.context, self.non_empty = noun, choices, context, non_empty

    def __get_pydantic_core_schema__(self, source, handler):
        return core_schema.with_info_wrap_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema, handler):
        out = handler(schema)
        out["propertyNames"] = {
            "description": self.noun,
            **({"enum": list(self.choices)} if self.choices else {}),
        }
        return out

    def _check(self, value, inner, info: ValidationInfo):
        choices = self.choices or (info.context or {}).get(self.context)
        if isinstance(value, dict):
            for key in value:
                if choices is not None and key not in choices:
                    raise _fail(
                        (str(key),),
                        f"unknown {self.noun} (expected one of: {', '.join(choices)})",
                        value[key],
                    )
            if self.non_empty and not value:
                raise PydanticCustomError(
                    _OWN + "empty",
                    f"expected at least one {self.noun} ({', '.join(choices or ())}), found an empty mapping",
                )
        return inner(value)


class FormatModel(BaseModel):
    """A mapping of a file: strict types, missing and unknown keys named with what is expected."""

    model_config = ConfigDict(strict=True, extra="forbid")
    #: the word for a key in "unknown key (expected one of: ...)"
    key_noun: ClassVar[str] = "key"
    #: False: keys the model does not name are kept as they are (the manifest's records)
    closed: ClassVar[bool] = True

    @classmethod
    def known_keys(cls, context) -> list[str] | None:
        """The keys listed when one is unknown, besides the fields (None: any key)."""
        return sorted(cls.model_fields)

    @classmethod
    def check_raw(cls, data: dict, context) -> None:
        """Checks of the raw mapping across keys, before its values are validated."""

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data, info: ValidationInfo):
        if not isinstance(data, dict):
            return data  # pydantic says it: expected a mapping, found ...
        known = cls.known_keys(info.context) if cls.closed else None
        if known is not None:
            for key in data:
                if key not in known and key not in cls.model_fields:
                    raise _fail(
                        (str(key),),
                        f"unknown {cls.key_noun} (expected one of: {', '.join(known)})",
                        data[key],
                    )
        for name, info_ in cls.model_fields.items():
            if info_.is_required() and name not in data:
                what = next((m.what for m in info_.metadata if isinstance(m, Expect)), None)
                raise _fail((name,), f"missing (expected {what})" if what else "missing", data)
        cls.check_raw(data, info.context)
        return data


class OpenModel(FormatModel):
    """A record other tools may extend: keys the model does not name are kept."""

    model_config = ConfigDict(extra="allow")
    closed: ClassVar[bool] = False


# -- suite.yaml ------------------------------------------------------------------------------

Identifier = Annotated[str, Field(pattern=ID_PATTERN), Expect("a string", "letters, digits, '_', '.', '-'")]
Prompt = Annotated[str, Field(pattern=r"\S"), Expect("a prompt string", "a non-empty prompt")]
Seed = Annotated[int, Field(ge=0, lt=2**63), Expect("an integer seed", "a seed in [0, 2**63)")]
Scalar = Annotated[
    str | int | Annotated[float, Field(allow_inf_nan=False)] | bool,
    Expect("a scalar (string, number or bool)", "a finite number"),
]
# as ever, any empty value (`params:`, `params: []`, `params: 0`) means no parameters
Params = Annotated[
    Optional[Annotated[dict[str, Scalar], Expect("a mapping of parameter names to scalars")]],
    BeforeValidator(lambda v: v if v or isinstance(v, dict) else None),
]
Text = Annotated[str, Expect("a string")]


class ClipEntry(FormatModel):
    """One source clip of a suite (an item of `clips`)."""

    id: Identifier = Field(
        description="The clip's id, unique in the suite; jobs name the clip by it and job ids start with it."
    )
    path: Annotated[str, Expect("a path string")] = Field(
        description="The clip, relative to the suite file: a video, an image or a folder of "
        "images; it must exist."
    )
    description: Text = Field("", description="Free text.")

    @field_validator("path")
    @classmethod
    def _exists(cls, rel: str, info: ValidationInfo) -> str:
        base = (info.context or {}).get("base")
        if base is not None and not (Path(base) / rel).resolve().exists():
            raise PydanticCustomError(_OWN + "clip", f"clip not found: {(Path(base) / rel).resolve()}")
        return rel


class JobEntry(FormatModel):
    """One job of a suite's explicit list (an item of `jobs`)."""

    clip: Annotated[str, Expect("a clip id")] = Field(description="The id of one of `clips`.")
    prompt: Prompt = Field(description="The prompt: not empty.")
    seed: Seed = Field(description="The seed, from 0 to 2**63 - 1.")
    params: Params = Field(
        None, description="Renderer parameters; they merge over the suite's shared `params`."
    )


ClipItem = Annotated[ClipEntry, Expect("a mapping with id and path")]
JobItem = Annotated[JobEntry, Expect("a mapping with clip, prompt and seed")]


class SuiteFile(FormatModel):
    """A suite: source clips, and either prompts x seeds or an explicit list of jobs."""

    schema_version: Literal[1] = Field(description="The format's version: 1.")
    name: Identifier = Field(description="The suite's name: letters, digits, `_`, `.`, `-`.")
    description: Text = Field("", description="Free text.")
    renderer: Annotated[Optional[str], Expect("a renderer name")] = Field(
        None, description="Default renderer of `evalkit render` (`--renderer` overrides it)."
    )
    clips: Annotated[
        list[ClipItem], Field(min_length=1), Expect("a list of {id, path}", "at least one clip")
    ] = Field(description="The source clips, at least one.")
    params: Params = Field(
        None, description="Renderer parameters shared by every job (strings, numbers, bools)."
    )
    # None when absent; given, they are lists (`prompts: null` is an error, as `clips: null` is)
    prompts: Annotated[
        list[Prompt], Field(min_length=1), Expect("a list of prompt strings", "at least one prompt")
    ] = Field(None, description="With `seeds`: one job per clip, prompt and seed. Not with `jobs`.")
    seeds: Annotated[
        list[Seed], Field(min_length=1), Expect("a list of integer seeds", "at least one seed")
    ] = Field(None, description="With `prompts`: integers from 0 to 2**63 - 1.")
    jobs: Annotated[
        list[JobItem], Field(min_length=1), Expect("a list of {clip, prompt, seed}", "at least one job")
    ] = Field(None, description="An explicit list of jobs, instead of `prompts` and `seeds`.")

    @classmethod
    def check_raw(cls, data: dict, context) -> None:
        if "jobs" in data and ("prompts" in data or "seeds" in data):
            raise _fail(("jobs",), "give either 'jobs' or 'prompts' and 'seeds', not both", data["jobs"])
        if "jobs" not in data:
            for key in ("prompts", "seeds"):
                if key not in data:
                    raise _fail(
                        (key,), "missing (give 'prompts' and 'seeds', or an explicit 'jobs' list)", data
                    )

    @model_validator(mode="after")
    def _references(self) -> "SuiteFile":
        ids = [c.id for c in self.clips]
        for i, j in _duplicates(ids):
            raise _fail(("clips", i, "id"), f"duplicate clip id {ids[i]!r}", ids[i])
        for i, job in enumerate(self.jobs or ()):
            if job.clip not in ids:
                raise _fail(
                    ("jobs", i, "clip"), f"unknown clip {job.clip!r} (clips: {', '.join(ids)})", job.clip
                )
        for key in ("prompts", "seeds"):
            values = getattr(self, key) or []
            for i, j in _duplicates(values):
                raise _fail((key, i), f"duplicate of {key}[{j}] (every job would be there twice)", values[i])
        return self


def _duplicates(values: list):
    """(index, index of the first equal value) for each repeated value."""
    first: dict = {}
    for i, v in enumerate(values):
        if v in first:
            yield i, first[v]
        first.setdefault(v, i)


# -- gate.yaml -------------------------------------------------------------------------------

Number = Annotated[float, Field(allow_inf_nan=False), Expect("a number", "a finite number")]


def _ordered(bounds: dict) -> dict:
    """A min above its max can never pass: a contradiction, not a gate."""
    if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
        raise PydanticCustomError(
            _OWN + "expected",
            f"expected min <= max, found min {bounds['min']:g} > max {bounds['max']:g} (no value passes)",
        )
    return bounds


BoundMap = Annotated[
    dict[str, Number],
    Keys("bound", BOUNDS, non_empty=True),
    Expect("a mapping like {max: 0.05}"),
    AfterValidator(_ordered),
]
Thresholds = Annotated[
    dict[str, BoundMap],
    Keys("aggregate", AGGREGATES, non_empty=True),
    Expect("a mapping like {mean: {max: 0.05}}"),
]


class HumanThreshold(FormatModel):
    """Where a gate's number came from when people set it (`human_threshold`, written by
    `evalkit study gate` from a threshold study): the human detection threshold, its interval,
    the study and the safety factor. When `metric` is `lpips`, the compare report draws `value`
    as a line on its per-frame LPIPS plots."""

    metric: Annotated[
        str, Field(pattern=r"^[a-z][a-z0-9_]*$"), Expect("a metric name", "a metric key such as lpips")
    ] = Field(
        description="The metric the threshold is in (a key of `evalkit.metrics.catalogue`, e.g. `lpips`)."
    )
    value: Annotated[float, Field(gt=0, allow_inf_nan=False), Expect("a number", "a positive number")] = (
        Field(
            description="The threshold: the metric value at which raters answer the ABX trial "
            "right 75% of the time without lapses (with `bound: lower`, a lower bound)."
        )
    )
    ci: Annotated[
        list[
            Optional[
                Annotated[
                    float, Field(gt=0, allow_inf_nan=False), Expect("a number or null", "a positive number")
                ]
            ]
        ],
        Field(min_length=2, max_length=2),
        Expect("a list [low, high]", "two entries [low, high]"),
    ] = Field(
        description="The threshold's interval [low, high] (bootstrap clustered over raters and "
        "clips); null for an open end."
    )
    study: Annotated[str, Field(min_length=1), Expect("a study name", "a non-empty name")] = Field(
        description="The threshold study the number came from."
    )
    safety_factor: Annotated[float, Field(ge=1, allow_inf_nan=False), Expect("a number", "a number >= 1")] = (
        Field(description="The gate's bound is `value / safety_factor`.")
    )
    criterion: Annotated[
        float, Field(gt=0.5, lt=1, allow_inf_nan=False), Expect("a number", "a proportion in (0.5, 1)")
    ] = Field(0.75, description="The proportion correct (without lapses) that defines the threshold.")
    aggregate: Annotated[Literal["mean", "p95", "worst"], Expect("an aggregate (mean, p95, worst)")] = Field(
        "mean", description="The aggregate the gate's bound applies to."
    )
    bound: Annotated[Optional[Literal["lower"]], Expect("lower or null")] = Field(
        None, description="`lower`: the threshold lay above every level shown and `value` is a lower bound."
    )

    @model_validator(mode="after")
    def _order(self) -> "HumanThreshold":
        lo, hi = self.ci
        if lo is not None and hi is not None and lo > hi:
            raise _fail(("ci",), f"expected [low, high] with low <= high, found {self.ci}", self.ci)
        if (lo is not None and self.value < lo * (1 - 1e-9)) or (
            hi is not None and self.value > hi * (1 + 1e-9)
        ):
            raise _fail(("value",), f"expected a value within ci {self.ci}, found {self.value}", self.value)
        return self

    @field_validator("metric")
    @classmethod
    def _known(cls, metric: str, info: ValidationInfo) -> str:
        metrics = (info.context or {}).get("metrics")
        if metrics is not None and metric not in metrics:
            raise PydanticCustomError(
                _OWN + "unknown", f"unknown metric {metric!r} (expected one of: {', '.join(metrics)})"
            )
        return metric


class GateFile(FormatModel):
    """A regression gate: thresholds on the compare report's aggregates, absolute (a metric's
    own key) or relative to a noise floor (`floor_ratio`)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Thresholds]
    key_noun: ClassVar[str] = "metric"
    #: (name, description) of the row that documents the extra keys
    extra_keys: ClassVar[tuple[str, str]] = (
        "<metric>",
        "Absolute thresholds of one metric (a key of `evalkit.metrics.catalogue`, such as "
        "`lpips` or `psnr`): `{aggregate: {max or min: number}}`.",
    )

    schema_version: Literal[1] = Field(1, description="The format's version: 1.")
    floor_ratio: Optional[
        Annotated[
            dict[str, Thresholds], Keys("metric", context="ratio_metrics"), Expect("a mapping of metrics")
        ]
    ] = Field(
        None,
        description="Thresholds on the ratio of each aggregate to the noise floor's, "
        "by metric (those with a floor-ratio rule).",
    )
    floor: Annotated[Optional[str], Expect("a floor name (seed, rerender...)")] = Field(
        None,
        description="Which floor the ratios use: `seed` (the default when present), "
        "`rerender`, or a floor's name.",
    )
    max_missing_jobs: Annotated[
        int, Field(ge=0), Expect("a non-negative integer", "a non-negative integer")
    ] = Field(0, description="How many jobs may go uncompared (missing, failed, corrupt).")
    max_offset_frames: Annotated[
        int, Field(ge=0), Expect("a non-negative integer", "a non-negative integer")
    ] = Field(
        0,
        description="The largest temporal offset (frames, either way) a compared clip of B "
        "may have against A; default 0: any offset fails the gate.",
    )
    human_threshold: Annotated[
        Optional[HumanThreshold], Expect("a mapping with metric, value, ci, study and safety_factor")
    ] = Field(
        None,
        description="Where the gate came from when people set it: a threshold study's "
        "result (see `HumanThreshold`); informative, checked but not a check.",
    )

    conventions: Annotated[
        Optional[dict[str, Annotated[str, Expect("a string")]]],
        Expect("a mapping of convention names to strings"),
    ] = Field(
        None,
        description="The conventions the thresholds were set under, as a compare report "
        "records them (`summary.json` `conventions`: `flow`, `ssim`...); a "
        "report measured under others is refused unless told "
        "(`--ignore-conventions`). `evalkit gate --pin` writes them.",
    )

    @classmethod
    def known_keys(cls, context) -> list[str] | None:
        # the caller names the metrics (evalkit.compare: the catalogue's); without them (a round
        # trip, a test) any other key is taken for a metric
        metrics = (context or {}).get("metrics")
        return list(metrics) if metrics is not None else None

    @property
    def metrics(self) -> dict[str, dict]:
        """The absolute thresholds, in the file's order."""
        return dict(self.__pydantic_extra__ or {})


# -- manifest.json ---------------------------------------------------------------------------

Object = Annotated[dict[str, Any], Expect("an object")]
Str = Annotated[str, Expect("a string")]
Int = Annotated[int, Expect("an integer")]


class OutputRecord(OpenModel):
    """A done job's clip (a job's `output`)."""

    path: Str = Field(description="The lossless clip, relative to the run folder and inside it.")
    sha256: Annotated[
        str, Field(pattern=r"^[0-9a-f]{64}$"), Expect("a string", "64 lowercase hex digits")
    ] = Field(description="Of the clip's bytes; a done job whose clip differs is rendered again.")
    frames: Optional[Int] = Field(None, description="Frame count.")
    width: Optional[Int] = Field(None, description="In pixels.")
    height: Optional[Int] = Field(None, description="In pixels.")
    fps: Optional[Str] = Field(None, description="Frame rate, as a fraction (`24`, `30000/1001`).")

    @field_validator("path")
    @classmethod
    def _inside(cls, rel: str) -> str:
        return inside_run(rel)


def inside_run(rel: str | None) -> str | None:
    """A path of a manifest, relative to the run folder and inside it (a path that leaves it,
    absolute or through ``..``, would have a run read another run's clips)."""
    if rel is None:
        return rel
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts:
        raise PydanticCustomError(
            _OWN + "expected",
            f"expected a path relative to the run folder and inside it, found {found(rel, typed=False)}",
        )
    return rel


class JobRecord(OpenModel):
    """One job of a run (an item of `jobs`)."""

    id: Str = Field(description="The job's id (see the suite).")
    clip: Str = Field(description="Clip id.")
    prompt: Str = Field(description="Prompt.")
    seed: Int = Field(description="The suite's seed.")
    params: Optional[Object] = Field(None, description="Renderer parameters.")
    status: Literal["pending", "done", "failed"] = Field(description="`pending`, `done` or `failed`.")
    error: Annotated[Optional[str], Expect("a string or null")] = Field(None, description="Why it failed.")
    timing: Optional[Object] = Field(
        None, description="Wall time, peak RSS and, on GPUs, peak device memory."
    )
    output: Optional[OutputRecord] = Field(None, description="The clip, once done.")
    preview: Annotated[Optional[str], Expect("a string or null")] = Field(
        None, description="The browser copy, relative to the run folder."
    )
    finished: Annotated[Optional[str], Expect("a string or null")] = Field(
        None, description="When it finished (ISO 8601, UTC)."
    )

    @field_validator("preview")
    @classmethod
    def _inside(cls, rel: str | None) -> str | None:
        return inside_run(rel)

    effective_seed: Optional[Int] = Field(
        None, description="The seed rendered with: `seed` plus the run's `--seed-offset`."
    )
    adopted_from: Optional[Object] = Field(
        None, description="`-r import`: the file or frame folder adopted (`path`, `kind`, `sha256`)."
    )


class SuiteRecord(OpenModel):
    """What a run records about its suite (`suite`)."""

    name: Optional[Str] = Field(None, description="The suite's name.")
    path: Optional[Str] = Field(None, description="The suite file.")
    sha256: Optional[Str] = Field(
        None, description="Of the suite file's bytes: runs of other contents are not compared."
    )
    clips: Optional[Annotated[dict[str, str], Expect("a mapping of clip ids to paths")]] = Field(
        None, description="Clip id to source clip path."
    )
    jobs: Optional[Int] = Field(None, description="How many jobs the suite has.")


#: lossless formats of run clips and their file extensions (:data:`evalkit.lossless.LOSSLESS_FORMATS`)
LOSSLESS_EXTS = {name: f.ext for name, f in LOSSLESS_FORMATS.items()}


class LosslessRecord(FormatModel):
    """The lossless format of a run's clips (`lossless`; absent: FFV1, `.mkv`)."""

    codec: Literal["ffv1", "utvideo"] = Field(
        description="`ffv1` (FFV1 in Matroska) or `utvideo` (UT Video in NUT): `render --lossless`."
    )
    ext: Literal[".mkv", ".nut"] = Field(
        description="The clips' file extension: `.mkv` for `ffv1`, `.nut` for `utvideo`."
    )

    @model_validator(mode="after")
    def _ext_matches(self) -> "LosslessRecord":
        want = LOSSLESS_EXTS[self.codec]
        if self.ext != want:
            raise _fail(("ext",), f"expected {want!r} for codec {self.codec!r}, found {self.ext!r}", self.ext)
        return self


class ManifestFile(OpenModel):
    """A run folder's `manifest.json`: what ran, where, and each job's state."""

    schema_version: Literal[1] = Field(description="The format's version: 1.")
    evalkit_version: Optional[Str] = Field(None, description="The evalkit that wrote it.")
    created: Optional[Str] = Field(None, description="ISO 8601, UTC.")
    updated: Optional[Str] = Field(None, description="ISO 8601, UTC; every save.")
    suite: Annotated[SuiteRecord, Expect("an object")] = Field(description="The suite.")
    renderer: Object = Field(
        description="Renderer name, version, options, `noise`; the "
        "diffusers-based ones add the model and its hashes."
    )
    backend: Object = Field(description="The backend spec (`spec`) and its parsed keys.")
    fingerprint: Object = Field(
        description="Host, software versions, device and numerics settings (listed above)."
    )
    notes: Optional[Object] = Field(None, description="`seed_offset`, `executor`.")
    label: Optional[Annotated[str, Field(pattern=LABEL_PATTERN), Expect("a string", LABEL_RULE)]] = Field(
        None,
        description="The run's name (`render --label`): its folder, and how reports "
        "and studies name it; absent: the backend spec names it.",
    )
    adopted: Optional[Object] = Field(
        None,
        description="What was adopted from elsewhere and from where: `fingerprint_file` "
        "(`path`, `sha256`, `content`: the file given with `--fingerprint`), "
        "`local_fingerprint` (the machine that wrote the run folder), `dir` "
        "(the `import` renderer's folder), `backend_from`.",
    )
    lossless: Optional[Annotated[LosslessRecord, Expect("an object")]] = Field(
        None,
        description="The lossless format of the run's clips (`render --lossless`); "
        "absent: `ffv1` in `.mkv` (every run made before the choice).",
    )
    jobs: Annotated[list[JobRecord], Expect("a list of job records")] = Field(
        description="Every job of the run."
    )


ScalarOrNull = Optional[
    Annotated[
        str | int | Annotated[float, Field(allow_inf_nan=False)] | bool,
        Expect("a string, number, bool or null", "a finite number"),
    ]
]


class FingerprintFile(FormatModel):
    """The fingerprint of the machine that renders (`evalkit fingerprint --json > fp.json`),
    adopted by `evalkit render --fingerprint fp.json`."""

    schema_version: Literal[1] = Field(description="The format's version: 1.")
    evalkit_version: Optional[Str] = Field(None, description="The evalkit that wrote it.")
    created: Optional[Str] = Field(None, description="ISO 8601, UTC.")
    backend: Optional[Object] = Field(
        None,
        description="The backend spec it was taken for (`spec` and its parsed keys; "
        "`evalkit fingerprint -b SPEC`); an import without `-b` takes its "
        "`spec`.",
    )
    fingerprint: Annotated[
        dict[str, ScalarOrNull],
        Field(min_length=1),
        Expect("a mapping of names to strings, numbers, bools or null", "at least one entry"),
    ] = Field(
        description="What `render` records as a run's fingerprint: host, OS, CPU, device, "
        "device name, driver, CUDA/HIP, library versions, numerics flags (a file "
        "written by hand may hold any subset, e.g. `device_name` and `driver`)."
    )


#: format name -> its models, the file's own first (docs/formats.md has a table for each)
FORMATS: dict[str, tuple[type[FormatModel], ...]] = {
    "suite": (SuiteFile, ClipEntry, JobEntry),
    "manifest": (ManifestFile, SuiteRecord, LosslessRecord, JobRecord, OutputRecord),
    "gate": (GateFile, HumanThreshold),
    "fingerprint": (FingerprintFile,),
}
