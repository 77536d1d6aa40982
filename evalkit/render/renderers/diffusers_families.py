"""How each diffusers video-to-video family takes a job: one small, explicit mapping per family.

A :class:`Family` says how the source clip reaches the pipeline (``video=[PIL frames]``, or an
``LTXVideoCondition``), which pipeline argument the job's ``strength`` becomes (and how), which
frame counts and sizes the family can take, which arguments the renderer fills from the source
(``height``, ``width``, ``num_frames``), and what the output holds (the edited clip, or the
source followed by a continuation). The values are read from diffusers 0.42.1's pipelines
(``__call__``, ``check_inputs``, ``prepare_latents``); the table is in ``docs/rendering.md``.

:func:`check_jobs` applies the frame and size rules to a suite's jobs before any weights load:
a clip a family cannot take is a :class:`~evalkit.errors.UserError` (exit code 2) naming the
job and the clip, what was expected and what was found. Nothing is resized or padded silently:
``height``/``width`` job params are the only resize, done by the pipeline and recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalkit.errors import UserError

#: job param -> pipeline argument, for every family (before the family's own strength rule)
PARAM_NAMES = {"strength": "strength", "steps": "num_inference_steps", "guidance": "guidance_scale"}


@dataclass(frozen=True)
class Family:
    #: the diffusers pipeline class name
    name: str
    #: how the source clip is given: "video" (``video=[PIL frames]``) or "ltx_condition"
    #: (``conditions=[LTXVideoCondition(video=frames, frame_index=0, strength=...)]``)
    source: str = "video"
    #: the pipeline argument the job's ``strength`` becomes; None: the family takes none
    strength_arg: str | None = "strength"
    #: frames must satisfy ``n % frame_step == 1`` (the VAE's temporal compression); 1: any
    frame_step: int = 1
    #: height and width must be multiples of this (VAE downsampling x transformer patch)
    size_multiple: int = 8
    #: arguments filled from the source clip unless the job gives them
    from_source: tuple[str, ...] = ("height", "width")
    #: "edit": the output is the edited clip (as many frames as the source);
    #: "continuation": the output is source + ``num_frames`` new frames; the renderer keeps
    #: the new ones (as many as the source)
    output: str = "edit"
    #: fixed arguments the renderer adds (the job's params can override them)
    defaults: dict = field(default_factory=dict)
    #: whether the denoiser's attention goes through diffusers' attention dispatcher
    dispatcher: bool = True
    #: one line for the docs table
    note: str = ""

    def frames_ok(self, n: int) -> bool:
        return self.frame_step <= 1 or n % self.frame_step == 1

    def frames_rule(self) -> str:
        if self.frame_step <= 1:
            return "any"
        k = self.frame_step
        return f"{k}k+1 (e.g. {2 * k + 1}, {4 * k + 1}, {8 * k + 1})"


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "WanVideoToVideoPipeline",
            frame_step=4,
            size_multiple=16,
            note="SDEdit: the source is encoded, noised to `strength`, denoised",
        ),
        Family(
            "WanVACEPipeline",
            strength_arg=None,
            frame_step=4,
            size_multiple=16,
            from_source=("height", "width", "num_frames"),
            note="the source is VACE's control video (mask: all frames regenerated); no strength",
        ),
        # 8k+1, not the 4k+1 of its temporal compression: its VAE decodes an even number of
        # latent frames into 4 frames each (5 frames in, 8 out), an odd number into 4k+1
        Family(
            "CogVideoXVideoToVideoPipeline",
            frame_step=8,
            size_multiple=16,
            dispatcher=False,
            note="SDEdit; 8k+1 frames: an odd latent count (the VAE decodes an even one to 4k)",
        ),
        Family(
            "LTXConditionPipeline",
            source="ltx_condition",
            strength_arg="condition_strength",
            frame_step=8,
            size_multiple=32,
            from_source=("height", "width", "num_frames"),
            note="the source is a condition at frame 0 with strength 1 - `strength`",
        ),
        Family(
            "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
            strength_arg=None,
            frame_step=4,
            size_multiple=16,
            from_source=("height", "width", "num_frames"),
            output="continuation",
            note="extends the source by as many frames (starting from its last "
            "`overlap_history` frames); the new frames are the output",
        ),
        Family(
            "AnimateDiffVideoToVideoPipeline",
            frame_step=1,
            size_multiple=8,
            dispatcher=False,
            note="SDEdit on a UNet with motion modules",
        ),
    )
}


def family_for(pipeline_class) -> Family | None:
    """The family of a pipeline class (by its own name or a base class's), or None."""
    for cls in getattr(pipeline_class, "__mro__", ()):
        if cls.__name__ in FAMILIES:
            return FAMILIES[cls.__name__]
    return None


def skyreels_overlap(n: int) -> int:
    """SkyReels-V2's ``overlap_history`` default here: the source frames the continuation
    starts from (its first frames re-render them): 17 (the value its docs recommend), or at
    most about half of a shorter source, as a 4k+1 count."""
    return min(17, ((n + 1) // 2 - 1) // 4 * 4 + 1)


def check_jobs(
    family: Family, pipeline_name: str, jobs, clip_info: dict, accepts: set[str], var_kw: bool
) -> None:
    """Refuse, before any weights load, jobs a family cannot take.

    ``clip_info``: clip id -> (frames, height, width) of the source. ``accepts``: the argument
    names of the pipeline's ``__call__``.
    """
    for job in jobs:
        where = f"job {job.id!r} (clip {job.clip!r})"
        for key in job.params:
            if key == "strength" and family.strength_arg is None:
                raise UserError(
                    f"{where}: params.strength: {pipeline_name} takes no strength "
                    f"({family.note}); remove it from the suite's params"
                )
            arg = PARAM_NAMES.get(key, key)
            if key != "strength" and arg not in accepts and not var_kw:
                raise UserError(f"{where}: params.{key}: {pipeline_name} takes no argument {arg!r}")
        steps, strength = job.params.get("steps"), job.params.get("strength")
        if (
            family.strength_arg == "strength"
            and steps is not None
            and strength is not None
            and int(steps * strength) < 1
        ):
            raise UserError(
                f"{where}: {pipeline_name} runs int(steps x strength) denoising "
                f"steps, params steps={steps}, strength={strength} give none "
                f"(expected steps x strength >= 1)"
            )
        n, h, w = clip_info[job.clip]
        if not family.frames_ok(n):
            raise UserError(
                f"{where}: {pipeline_name} takes {family.frames_rule()} frames, "
                f"the clip has {n} (trim the clip to "
                f"{(n - 1) // family.frame_step * family.frame_step + 1} frames)"
            )
        height = job.params.get("height", h)
        width = job.params.get("width", w)
        m = family.size_multiple
        if height % m or width % m:
            src = "params.height/width" if ("height" in job.params or "width" in job.params) else "the clip"
            raise UserError(
                f"{where}: {pipeline_name} takes heights and widths that are "
                f"multiples of {m}, {src} gives {width}x{height} (e.g. "
                f"{width // m * m or m}x{height // m * m or m})"
            )


def call_kwargs(
    family: Family | None, pipe, source, prompt: str, params: dict, generator
) -> tuple[dict, dict]:
    """The pipeline's keyword arguments for one job, and what to record about them.

    ``source``: (N, H, W, 3) uint8. Returns ``(kwargs, record)``; ``record`` holds the
    arguments that are plain values (what the manifest shows), with the source's shape.
    """
    from PIL import Image

    frames = [Image.fromarray(f) for f in source]
    n, h, w = source.shape[:3]
    kwargs: dict = {"prompt": prompt, "generator": generator, "output_type": "np"}
    record: dict = {"source_frames": n, "source_size": f"{w}x{h}"}
    fam = family or Family("generic", from_source=())
    if fam.name != "generic":
        record["family"] = fam.name
    fill = {"height": h, "width": w, "num_frames": n}
    for arg in fam.from_source:
        kwargs[arg] = fill[arg]
    kwargs.update(fam.defaults)
    strength = None
    for key, value in params.items():
        if key == "strength":
            strength = value
            continue
        kwargs[PARAM_NAMES.get(key, key)] = value
    if fam.name == "SkyReelsV2DiffusionForcingVideoToVideoPipeline":
        # one window: as many frames as the source (base_num_frames < num_frames would
        # generate in several overlapping windows)
        kwargs.setdefault("base_num_frames", kwargs.get("num_frames", n))
        kwargs.setdefault("overlap_history", skyreels_overlap(n))
    if fam.source == "ltx_condition":
        from diffusers.pipelines.ltx.pipeline_ltx_condition import LTXVideoCondition

        cond = 1.0 if strength is None else 1.0 - float(strength)
        kwargs["conditions"] = [LTXVideoCondition(video=frames, frame_index=0, strength=cond)]
        record["condition_strength"] = cond
    else:
        kwargs["video"] = frames
        if strength is not None:
            kwargs[fam.strength_arg or "strength"] = strength
    record.update(
        {
            k: v
            for k, v in kwargs.items()
            if k not in ("prompt", "generator", "video", "conditions")
            and isinstance(v, (int, float, str, bool))
        }
    )
    return kwargs, record


def output_frames(family: Family | None, frames, n_source: int):
    """The frames a job keeps: for a continuation family, the ones after the source."""
    if family is not None and family.output == "continuation":
        return frames[n_source:]
    return frames
