"""Renderer plugins: built-in names and ``module:attr`` import paths.

==========  ================================================================================
name        what it runs
==========  ================================================================================
diffusers   any diffusers video-to-video pipeline from a local folder or hub id (option model=)
command     an external program per job under a documented contract (option cmd=)
import      adopts renders made elsewhere, matched to jobs by id (option dir=)
canary      the built-in reference pipeline (models/canary), through the diffusers renderer
==========  ================================================================================
"""

from __future__ import annotations

from evalkit.render.renderers.base import (
    NOISE_POLICY,
    JobError,
    Renderer,
    RendererError,
    RenderRequest,
    WrittenClip,
    import_object,
    to_uint8_frames,
)

BUILTIN = {
    "diffusers": "evalkit.render.renderers.diffusers:DiffusersRenderer",
    "command": "evalkit.render.renderers.command:CommandRenderer",
    "import": "evalkit.render.renderers.imported:ImportRenderer",
    "canary": "evalkit.render.renderers.canary:CanaryRenderer",
}

__all__ = [
    "BUILTIN",
    "JobError",
    "NOISE_POLICY",
    "RenderRequest",
    "Renderer",
    "RendererError",
    "WrittenClip",
    "get_renderer",
    "to_uint8_frames",
]


def get_renderer(name: str, options: dict | None = None) -> Renderer:
    """Instantiate a renderer by built-in name or ``module:attr`` path."""
    target = BUILTIN.get(name, name)
    if ":" not in target:
        raise RendererError(
            f"renderer {name!r}: unknown (built-in: {', '.join(BUILTIN)}; "
            "or give an import path package.module:ClassName)"
        )
    cls = import_object(target, f"renderer {name!r}")
    if not isinstance(cls, type):  # os:system and the like: callable, not a class
        raise RendererError(
            f"renderer {name!r}: expected a renderer class, found {type(cls).__name__} {target}"
        )
    try:
        renderer = cls(**(options or {}))
    except TypeError as e:  # a class that is no renderer (subprocess:Popen) or takes no options
        if issubclass(cls, Renderer):
            raise
        raise RendererError(
            f"renderer {name!r}: expected a renderer class (a subclass of "
            f"evalkit.render.renderers.Renderer), {target} cannot be made with "
            f"its options ({e})"
        ) from e
    for method in ("load", "render", "describe"):
        if not callable(getattr(renderer, method, None)):
            raise RendererError(f"renderer {name!r}: {target} has no {method}() method")
    return renderer
