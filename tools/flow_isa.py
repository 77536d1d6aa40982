"""Instruction counts of the fused flow's products and blur kernels for sm_90, compiled offline
with the local Triton (no GPU needed: Triton's LLVM and its bundled ptxas/cuobjdump):

    python tools/flow_isa.py                                  # metrics/_triton_flow.py
    python tools/flow_isa.py OTHER_TREE/metrics/_triton_flow.py

Per kernel: pixels per thread, PTX and SASS instructions (static), the SASS instructions run by
each path through the first conditional branch (blur_x: unclamped and border programs) per
thread and per pixel, registers and spills (ptxas -v), and the float32 PTX operations (the same
multiset per pixel before and after an index-only change). Pointers are taken 16-byte aligned,
as the JIT specialises them; the window's radius is 12 (sigma 4). A static count, not a timing:
a proxy for the instruction cost, to be confirmed on the GPU.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
TARGET = GPUTarget("cuda", 90, 32)
KERNELS = {"_products_kernel": "PRODUCTS_TILE", "_blur_x_kernel": "BLUR_X_TILE"}
FLOATS = ("sx", "sy", "alpha")


def _module(path: Path):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(f"flow_isa_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _paths(sass: str) -> list[int]:
    """Instructions run along each side of the first conditional branch (EXIT ends a path)."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    ins = [(a, t) for a, t in ins if not t.startswith("NOP")]
    at = {a: i for i, (a, _) in enumerate(ins)}

    def walk(take: bool) -> int:
        i, n, seen = 0, 0, False
        while i < len(ins):
            a, t = ins[i]
            n += 1
            b = re.match(r"(@!?U?P\w+ )?BRA (0x[0-9a-f]+)$", t)
            if t == "EXIT" or (b and int(b.group(2), 16) == a):
                break
            if b and (b.group(1) is None or (not seen and take)):
                seen = seen or b.group(1) is not None
                i = at[int(b.group(2), 16)]
                continue
            seen = seen or bool(b)
            i += 1
        return n

    return sorted({walk(False), walk(True)})


def count(path: Path) -> None:
    mod = _module(path)
    print(f"{path}:")
    for name, tile_name in KERNELS.items():
        fn = getattr(mod, name)
        const = {"R": 12}
        if hasattr(mod, tile_name):  # 2-D row kernels: (rows, x, warps)
            rows, bx, warps = getattr(mod, tile_name)
            const.update(ROWS=rows, BX=bx)
            per_thread = rows * bx // (32 * warps)
        else:  # 1-D per-pixel kernels
            warps = 4
            const["BLOCK"] = mod.BLOCK
            per_thread = mod.BLOCK // (32 * warps)
        const = {k: v for k, v in const.items() if k in fn.arg_names}
        sig, attrs = {}, {}
        for i, a in enumerate(fn.arg_names):
            if a in const:
                sig[a] = "constexpr"
            elif a.endswith("_ptr"):
                sig[a] = "*fp32"
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                sig[a] = "fp32" if a in FLOATS else "i32"
        k = triton.compile(ASTSource(fn, sig, const, attrs), target=TARGET, options={"num_warps": warps})
        ptx = k.asm["ptx"]
        body = ptx[ptx.index(".entry") :]
        n_ptx = sum(
            1
            for line in body.splitlines()
            if re.match(r"\s*(@%p\d+\s+)?[a-z]", line) and not line.strip().endswith(":")
        )
        floats = collections.Counter(
            re.findall(r"\b((?:fma|mul|add|sub|div|max|min|neg)\.[a-z.]*f32)\b", body)
        )
        with tempfile.TemporaryDirectory() as tmp:
            cubin, ptx_file = Path(tmp) / "k.cubin", Path(tmp) / "k.ptx"
            cubin.write_bytes(k.asm["cubin"])
            ptx_file.write_text(ptx)
            sass = subprocess.run(
                [str(BIN / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, check=True
            ).stdout
            arch = re.search(r"\.target (\S+)", ptx).group(1)
            v = subprocess.run(
                [str(BIN / "ptxas"), f"-arch={arch}", "-v", str(ptx_file), "-o", "/dev/null"],
                capture_output=True,
                text=True,
            ).stderr
        n_sass = len(
            [t for t in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass) if not t.startswith("NOP")]
        )
        paths = _paths(sass)
        regs = re.search(r"Used (\d+) registers", v)
        spills = re.search(r"(\d+) bytes spill stores", v)
        print(
            f"  {name:20s} {const} warps {warps}: {per_thread} px/thread; PTX {n_ptx}, SASS {n_sass}; "
            f"run per thread {paths} = {[round(p / per_thread, 1) for p in paths]} per px; "
            f"{regs.group(1) if regs else '?'} registers, {spills.group(1) if spills else '?'} B spilled"
        )
        print(
            "    f32 ops per px (every path): "
            + ", ".join(f"{op} {c / per_thread:g}" for op, c in sorted(floats.items()))
        )


if __name__ == "__main__":
    for arg in sys.argv[1:] or [str(ROOT / "metrics" / "_triton_flow.py")]:
        count(Path(arg))
