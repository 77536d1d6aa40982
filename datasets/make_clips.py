#!/usr/bin/env python
"""Generate the source clips of the ``smoke`` and ``canary`` suites from bundled photographs.

Every clip is a virtual camera filming one photograph (a flat print) that ships inside an
installed package (scikit-image's ``skimage/data`` and scikit-learn's
``sklearn/datasets/images``; nothing is downloaded). The camera is a pinhole model with a pose
per instant: a look-at point on the print, a distance (dolly), orbit angles, and pan/tilt/roll
about its own centre, plus optional hand-held shake. Each pose gives a homography that
``cv2.warpPerspective`` (bicubic, ``BORDER_REFLECT``) uses to render the frame, from a copy of
the photograph area-downscaled to about the rendering scale so nothing aliases. Motion is
smooth and sub-pixel: parameters ramp with eased curves, shake is a sum of random low-frequency
sinusoids (spectrally shaped noise), and each frame integrates a 180-degree shutter (several
sub-frame renders averaged), so fast moves carry natural motion blur. The ``*_object`` clips
also move a cut-out (an ellipse with a soft edge taken from another photograph) along a curved
path over the background, through the same camera.

Everything is deterministic: the only randomness is a numpy ``Generator`` seeded from the clip
id, there is no clock, and per-frame matrices are rounded to 12 significant digits so that
last-bit differences in floating point cannot move a pixel. With the versions pinned in
``requirements.lock`` the output is byte-identical from run to run; ``--check`` verifies the
committed clips.

Usage::

    python datasets/make_clips.py                    # all suites into datasets/<suite>/clips/
    python datasets/make_clips.py --suite smoke      # one suite
    python datasets/make_clips.py --out /tmp/clips   # into /tmp/clips/<suite>/clips/
    python datasets/make_clips.py --check            # regenerate in a temp folder and compare
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script from a checkout without an installed evalkit
    sys.path.insert(0, str(REPO))

from evalkit.video import ClipReader, write_lossless  # noqa: E402

SEED_BASE = 20240611
#: Fraction of the frame interval the shutter is open (180-degree shutter) and how many
#: sub-frame renders integrate it.
SHUTTER = 0.5
SUBFRAMES = 5

# -- photographs ---------------------------------------------------------------------------


def _package_dir(module: str, *sub: str) -> Path:
    import importlib

    mod = importlib.import_module(module)
    return Path(os.path.dirname(mod.__file__)).joinpath(*sub)


#: name -> (package module, file). Licences: see datasets/README.md.
PHOTOS = {
    "astronaut": ("skimage.data", "astronaut.png"),
    "coffee": ("skimage.data", "coffee.png"),
    "chelsea": ("skimage.data", "chelsea.png"),
    "rocket": ("skimage.data", "rocket.jpg"),
    "camera": ("skimage.data", "camera.png"),
    "hubble": ("skimage.data", "hubble_deep_field.jpg"),
    "china": ("sklearn.datasets", "images/china.jpg"),
    "flower": ("sklearn.datasets", "images/flower.jpg"),
}


def photo_path(name: str) -> Path:
    module, rel = PHOTOS[name]
    return _package_dir(module, *rel.split("/"))


_PHOTO_CACHE: dict[str, np.ndarray] = {}


def load_photo(name: str) -> np.ndarray:
    """The photograph as an (H, W, 3) uint8 RGB array (grey images are replicated)."""
    if name not in _PHOTO_CACHE:
        from PIL import Image

        path = photo_path(name)
        if not path.is_file():
            raise FileNotFoundError(
                f"photograph '{name}' not found at {path} (is the package installed from requirements.lock?)"
            )
        with Image.open(path) as im:
            _PHOTO_CACHE[name] = np.ascontiguousarray(np.asarray(im.convert("RGB"), np.uint8))
    return _PHOTO_CACHE[name]


# -- curves --------------------------------------------------------------------------------


def ease(u: float, kind: str = "soft") -> float:
    """Map normalised time u in [0, 1] to progress in [0, 1].

    ``linear``; ``inout`` (sine ease in and out: starts and stops at rest); ``soft`` (mostly
    eased but never quite at rest, like a move the operator started just before the cut);
    ``out`` (starts moving, settles at the end); ``in`` (starts at rest, accelerates).
    """
    u = min(1.0, max(0.0, u))
    if kind == "linear":
        return u
    if kind == "inout":
        return 0.5 - 0.5 * math.cos(math.pi * u)
    if kind == "soft":
        return 0.35 * u + 0.65 * (0.5 - 0.5 * math.cos(math.pi * u))
    if kind == "out":
        return math.sin(0.5 * math.pi * u)
    if kind == "in":
        return 1.0 - math.cos(0.5 * math.pi * u)
    raise ValueError(f"unknown easing {kind!r}")


@dataclass(frozen=True)
class Ramp:
    """A value moving from ``a`` to ``b`` over the clip with an easing curve."""

    a: float
    b: float
    kind: str = "soft"

    def __call__(self, u: float) -> float:
        return self.a + (self.b - self.a) * ease(u, self.kind)


Value = Union[float, Ramp]


def value(v: Value, u: float) -> float:
    return v(u) if callable(v) else float(v)


class Shake:
    """Smooth random jitter: a sum of sinusoids of random low frequency and phase, amplitude
    falling as 1/f (spectrally shaped noise), scaled to an RMS of ``rms``. Continuous in time,
    so sub-frame samples for motion blur are consistent."""

    def __init__(
        self, rng: np.random.Generator, rms: float, fmin: float = 0.5, fmax: float = 3.5, n: int = 7
    ):
        self.freqs = [float(f) for f in rng.uniform(fmin, fmax, n)]
        self.phases = [float(p) for p in rng.uniform(0.0, 2.0 * math.pi, n)]
        amps = [float(w) / f for w, f in zip(rng.uniform(0.6, 1.0, n), self.freqs)]
        norm = math.sqrt(sum(a * a for a in amps) / 2.0)
        self.amps = [rms * a / norm for a in amps]

    def __call__(self, t: float) -> float:
        return sum(
            a * math.sin(2.0 * math.pi * f * t + p) for a, f, p in zip(self.amps, self.freqs, self.phases)
        )


# -- shots ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sprite:
    """An ellipse cut out of ``photo`` (soft edge) moving over the background.

    ``center``/``radii`` select the ellipse in the sprite photo's pixels; ``height`` is the
    sprite's height in background-photo pixels; the path is a quadratic Bezier through
    ``start``, ``via`` (control point) and ``end`` (background-photo pixels), travelled with
    ``path_ease``; ``angle`` is its in-plane rotation in degrees; ``bob`` adds a gentle
    sinusoidal float of that many background pixels.
    """

    photo: str
    center: tuple[float, float]
    radii: tuple[float, float]
    height: float
    start: tuple[float, float]
    via: tuple[float, float]
    end: tuple[float, float]
    angle: Value = 0.0
    feather: float = 0.12
    path_ease: str = "soft"
    bob: float = 0.0


@dataclass(frozen=True)
class Shot:
    """A camera filming a photograph. Lengths are in pixels of the (original) photograph;
    angles in degrees. ``view`` is the width of print the frame covers at the look-at point
    when seen head-on (so the camera distance is ``focal * view / width``)."""

    photo: str
    motion: str  # short label of the motion type
    description: str
    look_x: Value
    look_y: Value
    view: Value
    fov: float = 40.0  # horizontal field of view
    azimuth: Value = 0.0  # orbit around the look-at point (+: camera moves right)
    elevation: Value = 0.0  # orbit (+: camera moves up)
    pan: Value = 0.0  # camera yaw about its centre (+: view moves right)
    tilt: Value = 0.0  # camera pitch (+: view moves up)
    roll: Value = 0.0  # camera roll
    shake: float = 0.0  # hand-held jitter, RMS degrees of pan/tilt (roll: half)
    sprite: Sprite | None = None


SHOTS: dict[str, Shot] = {
    "astronaut_pan": Shot(
        "astronaut",
        "pan",
        "Slow pan from the astronaut's face across to the shuttle model, slight tilt drift.",
        look_x=272,
        look_y=160,
        view=270,
        fov=30,
        pan=Ramp(-9.0, 7.5, "soft"),
        tilt=Ramp(-1.0, 1.0, "inout"),
    ),
    "coffee_zoom": Shot(
        "coffee",
        "zoom",
        "Dolly-in from the table onto the espresso cup.",
        look_x=Ramp(300, 292, "inout"),
        look_y=Ramp(200, 148, "inout"),
        view=Ramp(380, 220, "inout"),
        fov=40,
    ),
    "chelsea_handheld": Shot(
        "chelsea",
        "handheld",
        "Hand-held close-up of Chelsea the cat: smooth low-frequency shake, no deliberate move.",
        look_x=Ramp(222, 230, "linear"),
        look_y=150,
        view=250,
        fov=40,
        shake=0.45,
    ),
    "rocket_tilt": Shot(
        "rocket",
        "tilt",
        "Telephoto tilt up the launch tower, from the pad lights to the top of the rocket.",
        look_x=325,
        look_y=218,
        view=220,
        fov=24,
        tilt=Ramp(-7.0, 1.5, "soft"),
    ),
    "china_orbit": Shot(
        "china",
        "orbit",
        "Arc shot around the pagoda: the camera orbits the print, perspective changes.",
        look_x=Ramp(205, 235, "linear"),
        look_y=210,
        view=300,
        fov=40,
        azimuth=Ramp(-16.0, 16.0, "soft"),
        elevation=3.0,
    ),
    "flower_rotate": Shot(
        "flower",
        "rotate",
        "Camera roll around the dahlia (about 25 degrees), eased in and out.",
        look_x=306,
        look_y=221,
        view=250,
        fov=40,
        roll=Ramp(-13.0, 12.0, "inout"),
    ),
    "hubble_object": Shot(
        "hubble",
        "object+pan",
        "The astronaut (soft-edged cut-out) floats across the Hubble deep field, "
        "slowly tumbling, while the camera trucks slowly.",
        look_x=Ramp(430, 520, "linear"),
        look_y=Ramp(420, 460, "linear"),
        view=420,
        fov=40,
        sprite=Sprite(
            "astronaut",
            center=(200, 170),
            radii=(110, 145),
            height=180,
            start=(315, 485),
            via=(440, 330),
            end=(620, 400),
            angle=Ramp(-14.0, 9.0, "linear"),
            path_ease="soft",
            bob=4.0,
        ),
    ),
    "camera_push_handheld": Shot(
        "camera",
        "dolly+pan+handheld",
        "Hand-held push-in on the cameraman (greyscale photo) with a slight pan right.",
        look_x=Ramp(285, 315, "soft"),
        look_y=Ramp(235, 175, "soft"),
        view=Ramp(400, 270, "soft"),
        fov=40,
        shake=0.35,
    ),
}


@dataclass(frozen=True)
class SuiteSpec:
    clips: tuple[str, ...]
    size: int
    frames: int
    fps: int


SUITES: dict[str, SuiteSpec] = {
    "smoke": SuiteSpec(("astronaut_pan", "hubble_object"), size=64, frames=8, fps=24),
    "canary": SuiteSpec(tuple(SHOTS), size=256, frames=24, fps=24),
}


# -- camera geometry -------------------------------------------------------------------------


def _rot_x(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _rot_y(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def _rot_z(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def _round_sig(m: np.ndarray, digits: int = 12) -> np.ndarray:
    """Round to ``digits`` significant digits (normalised so m[2,2] == 1): last-bit float
    differences between machines then vanish instead of moving a pixel."""
    m = m / m[2, 2]
    return np.array([[float(f"{x:.{digits}g}") for x in row] for row in m])


class Camera:
    """Pose of a shot at time t -> homography from the photo's pixels to the frame's."""

    def __init__(
        self, shot: Shot, size: int, duration: float, rng: np.random.Generator, height: int | None = None
    ):
        self.shot = shot
        self.size = size  # frame width (and height, unless ``height``)
        self.height = size if height is None else height
        self.duration = duration
        self.focal = (size / 2) / math.tan(math.radians(shot.fov) / 2)
        self.shakes = None
        if shot.shake:
            r = shot.shake
            # yaw, pitch, roll (degrees) and a little translation (fraction of distance)
            self.shakes = (
                Shake(rng, r),
                Shake(rng, r),
                Shake(rng, r / 2),
                Shake(rng, 0.002),
                Shake(rng, 0.002),
            )

    def u(self, t: float) -> float:
        return 0.0 if self.duration <= 0 else t / self.duration

    def magnification(self, t: float) -> float:
        """Frame pixels per photo pixel at the look-at point (head-on)."""
        return self.size / value(self.shot.view, self.u(t))

    def world_to_image(self, t: float) -> np.ndarray:
        s, u = self.shot, self.u(t)
        look = np.array([value(s.look_x, u), value(s.look_y, u), 0.0])
        dist = self.focal * value(s.view, u) / self.size
        az, el = math.radians(value(s.azimuth, u)), math.radians(value(s.elevation, u))
        direction = np.array([math.sin(az) * math.cos(el), -math.sin(el), -math.cos(az) * math.cos(el)])
        centre = look + dist * direction
        z = -direction
        x = np.cross([0.0, 1.0, 0.0], z)
        x /= np.linalg.norm(x)
        y = np.cross(z, x)
        r0 = np.stack([x, y, z])  # world -> camera (x right, y down)
        pan, tilt, roll = value(s.pan, u), value(s.tilt, u), value(s.roll, u)
        if self.shakes:
            pan += self.shakes[0](t)
            tilt += self.shakes[1](t)
            roll += self.shakes[2](t)
            centre = centre + dist * np.array([self.shakes[3](t), self.shakes[4](t), 0.0])
        q = _rot_y(math.radians(pan)) @ _rot_x(math.radians(tilt)) @ _rot_z(math.radians(roll))
        r = q.T @ r0
        k = np.array([[self.focal, 0, self.size / 2], [0, self.focal, self.height / 2], [0, 0, 1]])
        # plane Z = 0: (X, Y, 1) -> K [r1 r2 -R C]
        return k @ np.column_stack([r[:, 0], r[:, 1], -r @ centre])


def _bezier(p0, p1, p2, s: float) -> tuple[float, float]:
    a, b, c = (1 - s) ** 2, 2 * (1 - s) * s, s * s
    return (a * p0[0] + b * p1[0] + c * p2[0], a * p0[1] + b * p1[1] + c * p2[1])


def _affine(tx, ty, angle_deg, scale, cx, cy) -> np.ndarray:
    """Sprite pixels -> background pixels: centre (cx, cy) goes to (tx, ty), rotated, scaled."""
    c, s = math.cos(math.radians(angle_deg)), math.sin(math.radians(angle_deg))
    return np.array(
        [
            [scale * c, -scale * s, tx - scale * (c * cx - s * cy)],
            [scale * s, scale * c, ty - scale * (s * cx + c * cy)],
            [0.0, 0.0, 1.0],
        ]
    )


def _prescaled(img: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Area-downscale ``img`` by ``scale`` (<= 1); return it and the matrix taking original
    pixel coordinates to the downscaled image's."""
    if scale >= 1.0:
        return img, np.eye(3)
    h, w = img.shape[:2]
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    small = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA)
    sx, sy = nw / w, nh / h
    # pixel centres: x_small + 0.5 = (x + 0.5) * sx
    return small, np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1.0]])


def _soft_ellipse(h: int, w: int, cx: float, cy: float, rx: float, ry: float, feather: float) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    r = np.sqrt(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2)
    a = np.clip((1.0 - r) / feather, 0.0, 1.0)
    return (a * a * (3.0 - 2.0 * a)).astype(np.float32)  # smoothstep edge


def _warp(src: np.ndarray, h_dst_from_src: np.ndarray, size, border: int) -> np.ndarray:
    """``size``: the frame's side, or its (width, height)."""
    inv = _round_sig(np.linalg.inv(h_dst_from_src))
    return cv2.warpPerspective(
        src,
        inv,
        size if isinstance(size, tuple) else (size, size),
        flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
        borderMode=border,
        borderValue=0,
    )


def clip_seed(clip_id: str) -> list[int]:
    return [SEED_BASE, zlib.crc32(clip_id.encode("utf-8"))]


def render_clip(
    clip_id: str,
    size: int,
    frames: int,
    fps: int,
    stats: dict | None = None,
    height: int | None = None,
    subframes: int = SUBFRAMES,
    first: int = 0,
    count: int | None = None,
) -> np.ndarray:
    """Render a shot: (frames, height or size, size, 3) uint8 RGB (``size`` is the width; the
    view covers the same width of the print at any height). ``first``/``count``: only frames
    ``first .. first + count - 1`` of the clip (the same pixels as in the whole clip), so a long
    clip can be rendered in parts."""
    shot = SHOTS[clip_id]
    rng = np.random.default_rng(clip_seed(clip_id))
    duration = (frames - 1) / fps
    h_out = size if height is None else height
    cam = Camera(shot, size, duration, rng, height)
    dsize = (size, h_out)
    times = [i / fps for i in range(frames)]
    sub = [(k + 0.5) / subframes * SHUTTER - SHUTTER / 2 for k in range(subframes)]
    all_t = [t + d / fps for t in times for d in sub]
    count = frames - first if count is None else count
    times = times[first : first + count]

    photo = load_photo(shot.photo)
    mag = max(cam.magnification(t) for t in all_t)
    bg, bg_pre = _prescaled(photo, min(1.0, mag))
    bg_from_photo = np.linalg.inv(bg_pre)

    sp = shot.sprite
    if sp is not None:
        sphoto = load_photo(sp.photo)
        sp_scale = sp.height / (2 * sp.radii[1])  # sprite px -> background px
        fg, fg_pre = _prescaled(sphoto, min(1.0, mag * sp_scale))
        fg_from_photo = np.linalg.inv(fg_pre)
        alpha_full = _soft_ellipse(
            sphoto.shape[0], sphoto.shape[1], sp.center[0], sp.center[1], sp.radii[0], sp.radii[1], sp.feather
        )
        alpha, _ = _prescaled(alpha_full, min(1.0, mag * sp_scale))
        bob_rng = rng.uniform(0.0, 2.0 * math.pi, 2)
        bob_phase = (float(bob_rng[0]), float(bob_rng[1]))

    ones = np.full(bg.shape[:2], 255, np.uint8)
    out = np.empty((len(times), h_out, size, 3), np.uint8)
    border_frac = 0.0
    for i, t0 in enumerate(times):
        acc = np.zeros((h_out, size, 3), np.float32)
        for d in sub:
            t = t0 + d / fps
            h_world = cam.world_to_image(t)
            img = _warp(bg, h_world @ bg_from_photo, dsize, cv2.BORDER_REFLECT).astype(np.float32)
            if d == sub[len(sub) // 2]:
                inside = _warp(ones, h_world @ bg_from_photo, dsize, cv2.BORDER_CONSTANT)
                border_frac = max(border_frac, float(np.mean(inside < 128)))
            if sp is not None:
                u = cam.u(t)
                px, py = _bezier(sp.start, sp.via, sp.end, ease(u, sp.path_ease))
                if sp.bob:
                    px += sp.bob * math.sin(2 * math.pi * 0.7 * t + bob_phase[0])
                    py += sp.bob * math.sin(2 * math.pi * 0.9 * t + bob_phase[1])
                a = _affine(px, py, value(sp.angle, u), sp_scale, sp.center[0], sp.center[1])
                h_sp = h_world @ a
                f = _warp(fg, h_sp @ fg_from_photo, dsize, cv2.BORDER_REFLECT).astype(np.float32)
                m = np.clip(_warp(alpha, h_sp @ fg_from_photo, dsize, cv2.BORDER_CONSTANT), 0.0, 1.0)[
                    ..., None
                ]
                img = img + m * (f - img)
            acc += img
        out[i] = np.clip(np.rint(acc / len(sub)), 0, 255).astype(np.uint8)
    if stats is not None:
        stats["border_frac"] = border_frac
        stats["prescale"] = min(1.0, mag)
    return out


# -- suites ----------------------------------------------------------------------------------


def clip_path(root: Path, suite: str, clip_id: str) -> Path:
    return Path(root) / suite / "clips" / f"{clip_id}.mkv"


def generate(suite: str, root: Path = HERE, verbose: bool = False) -> list[Path]:
    """Render every clip of ``suite`` into ``root/<suite>/clips/<id>.mkv``."""
    spec = SUITES[suite]
    paths = []
    for cid in spec.clips:
        stats: dict = {}
        frames = render_clip(cid, spec.size, spec.frames, spec.fps, stats)
        path = clip_path(root, suite, cid)
        write_lossless(path, frames, spec.fps)
        paths.append(path)
        if verbose:
            warn = "  WARNING: frame border shows" if stats["border_frac"] > 0.002 else ""
            print(
                f"{suite}/{cid}: {spec.frames}x{spec.size}x{spec.size} @ {spec.fps} fps, "
                f"{path.stat().st_size} bytes, border {stats['border_frac']:.2%}{warn}"
            )
    return paths


def compare(suite: str, generated_root: Path, committed_root: Path = HERE) -> list[str]:
    """Differences between generated and committed clips of ``suite`` (empty: identical)."""
    problems = []
    spec = SUITES[suite]
    committed_dir = Path(committed_root) / suite / "clips"
    for cid in spec.clips:
        new, old = clip_path(generated_root, suite, cid), clip_path(committed_root, suite, cid)
        if not old.is_file():
            problems.append(f"{suite}/{cid}: committed clip {old} is missing")
            continue
        a, b = ClipReader(new), ClipReader(old)
        fa, fb = a.read(), b.read()
        if a.info.fps != b.info.fps:
            problems.append(f"{suite}/{cid}: fps {b.info.fps} committed, {a.info.fps} generated")
        if fa.shape != fb.shape:
            problems.append(f"{suite}/{cid}: frames {fb.shape} committed, {fa.shape} generated")
            continue
        diff = np.flatnonzero((fa != fb).reshape(len(fa), -1).any(axis=1))
        if diff.size:
            worst = int(np.abs(fa.astype(np.int16) - fb.astype(np.int16)).max())
            problems.append(
                f"{suite}/{cid}: frames {diff.tolist()} differ from the committed "
                f"clip (max abs difference {worst})"
            )
    if committed_dir.is_dir():
        extra = sorted(p.name for p in committed_dir.glob("*.mkv") if p.stem not in spec.clips)
        if extra:
            problems.append(f"{suite}: committed clips not made by the generator: {extra}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="root folder: clips go to OUT/<suite>/clips/ (default: datasets/)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary folder and compare frames byte-for-byte "
        "with the committed clips (or those under --out); exit 1 on mismatch",
    )
    args = ap.parse_args(argv)
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    cv2.setNumThreads(1)
    if args.check:
        committed = args.out or HERE
        problems = []
        with tempfile.TemporaryDirectory(prefix="make_clips-") as tmp:
            for s in suites:
                generate(s, Path(tmp))
                problems += compare(s, Path(tmp), committed)
        if problems:
            print("make_clips --check: generated clips differ from the committed ones:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            print(
                "Regenerate with `python datasets/make_clips.py` if the change is intended "
                "(library versions other than requirements.lock can change pixels).",
                file=sys.stderr,
            )
            return 1
        print(f"make_clips --check: {', '.join(suites)}: all clips identical")
        return 0
    for s in suites:
        generate(s, args.out or HERE, verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
