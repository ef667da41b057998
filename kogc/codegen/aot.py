"""Ahead-of-time compilation of a generated Triton kernel, with no GPU.

``compile_kernel`` loads a ``@triton.jit`` function from a Python source file on disk and
runs ``triton.compile(ASTSource(...), target=GPUTarget(...))``.  Triton 3.6 does this on a
machine without a GPU: the NVIDIA backend uses its bundled ``ptxas``, the AMD backend its
bundled LLVM/lld.  ``disassembly_summary`` reads the artifacts back and counts what matters
for a persistent decode kernel (wide loads, acquire/release operations, registers, spills).

Triton 3.6 API facts this module relies on (checked against the installed sources):

* ``ASTSource(fn, signature, constexprs=None, attrs=None)``.  ``signature`` is keyed by
  argument NAME (string keys only; order does not matter), values are type strings such as
  ``"*fp16"``, ``"*i32"``, ``"i32"``, ``"i64"``, ``"fp32"`` or ``"constexpr"``.
  ``constexprs`` may be keyed by name (``{"BLOCK": 64}``) or by index path tuple
  (``{(5,): 64}``); names are converted to ``(fn.arg_names.index(name),)``.
  ``attrs`` is keyed by index path tuple: ``{(0,): [["tt.divisibility", 16]]}``.
* Without ``tt.divisibility`` on the pointers, Triton cannot prove alignment and emits
  scalar 16-bit loads for fp16 data; the runtime JIT adds the attribute for every 16-byte
  aligned tensor (all torch allocations).  ``compile_kernel`` therefore marks every pointer
  argument 16-byte divisible by default (``aligned_args`` overrides this).
* ``CompiledKernel.asm`` keys: cuda -> source, ttir, ttgir, llir, ptx, cubin (bytes);
  hip -> source, ttir, ttgir, llir, amdgcn, hsaco (bytes).

Interpreter mode: if ``TRITON_INTERPRET`` is on (``triton.knobs.runtime.interpret``),
``@triton.jit`` returns an ``InterpretedFunction`` at decoration time and constexpr
functions behave differently, so compiling in-process is unreliable.  In that case
``compile_kernel`` re-runs itself in a child Python process with ``TRITON_INTERPRET``
removed from the environment (constexpr values must then be JSON-able: None, bool, int,
float, str, or a ``triton.language`` dtype).
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ARTIFACT_KINDS: dict[str, tuple[str, ...]] = {
    "cuda": ("ttir", "ttgir", "llir", "ptx", "cubin"),
    "hip": ("ttir", "ttgir", "llir", "amdgcn", "hsaco"),
}
BINARY_KINDS = ("cubin", "hsaco")

_module_counter = itertools.count()


# --------------------------------------------------------------------------- helpers
def _interpret_on() -> bool:
    try:
        import triton
        return bool(triton.knobs.runtime.interpret)
    except Exception:  # pragma: no cover - knobs missing in other versions
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _load_jit_function(source_path: str, kernel_name: str):
    path = Path(source_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"kogc aot: kernel source {path} does not exist")
    mod_name = f"kogc_aot_gen_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{os.getpid()}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(mod_name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses / triton aggregates look their module up
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(mod_name, None)
        raise
    fn = getattr(module, kernel_name, None)
    if fn is None:
        raise AttributeError(f"kogc aot: {path} defines no attribute {kernel_name!r}")
    return fn


def _normalise_signature(fn, signature: dict, constexprs: dict) -> dict:
    sig = dict(signature)
    for k in constexprs:
        name = k if isinstance(k, str) else fn.arg_names[k[0]]
        sig.setdefault(name, "constexpr")
    unknown = [k for k in sig if k not in fn.arg_names]
    missing = [a for a in fn.arg_names if a not in sig]
    if unknown or missing:
        raise ValueError(f"kogc aot: signature does not match {fn.__name__}{tuple(fn.arg_names)}: "
                         f"unknown {unknown}, missing {missing}")
    given = {k if isinstance(k, str) else fn.arg_names[k[0]] for k in constexprs}
    no_value = [k for k, v in sig.items() if v == "constexpr" and k not in given]
    if no_value:
        raise ValueError(f"kogc aot: constexpr argument(s) {no_value} of {fn.__name__} have no value")
    return sig


def _compile_in_process(source_path, kernel_name, signature, constexprs, target, out_dir, num_warps,
                        aligned_args, options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    target, backend, arch, warp = target          # (name, Triton's GPUTarget fields): from kogc.targets
    gpu_target = GPUTarget(backend, arch, warp)
    fn = _load_jit_function(source_path, kernel_name)
    if not isinstance(fn, JITFunction):
        raise RuntimeError(f"kogc aot: {kernel_name} in {source_path} is a {type(fn).__name__}, not a "
                           f"triton JITFunction (TRITON_INTERPRET on when the module was imported?)")
    sig = _normalise_signature(fn, signature, constexprs)
    if aligned_args is None:
        aligned_args = [k for k, v in sig.items() if v.startswith("*")]
    attrs = {(fn.arg_names.index(a), ): [["tt.divisibility", 16]] for a in aligned_args}
    opts = {"num_warps": num_warps, **(options or {})}
    try:
        src = triton.compiler.ASTSource(fn, signature=sig, constexprs=dict(constexprs), attrs=attrs)
        kernel = triton.compile(src, target=gpu_target, options=opts)
    except Exception as e:  # CompilationError, KeyError for bad types, ptxas failures...
        inner = e       # a CompilationError names the outermost call; what failed is its innermost cause
        while inner.__cause__ is not None:
            inner = inner.__cause__
        why = f"{type(e).__name__}: {e}" + (f"\ninnermost: {type(inner).__name__}: {inner}" if inner is not e else "")
        raise RuntimeError(f"kogc aot: compiling {kernel_name} ({source_path}) for target {target!r} "
                           f"[{gpu_target}] failed: {why}") from e

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    for kind in ARTIFACT_KINDS[backend]:
        data = kernel.asm.get(kind)
        if data is None:
            raise RuntimeError(f"kogc aot: target {target!r}: Triton produced no {kind} for {kernel_name}")
        p = out / f"{kernel_name}.{kind}"
        if isinstance(data, bytes):
            p.write_bytes(data)
        else:
            p.write_text(data)
        paths[kind] = str(p)
    meta = kernel.metadata._asdict()
    meta["target"] = {"backend": backend, "arch": arch, "warp_size": warp}
    p = out / f"{kernel_name}.json"
    p.write_text(json.dumps(meta, default=str, indent=1, sort_keys=True))
    paths["metadata"] = str(p)
    return paths


def _encode_constexprs(constexprs: dict) -> list:
    import triton.language as tl
    enc = []
    for k, v in constexprs.items():
        key = k if isinstance(k, str) else list(k)
        if isinstance(v, tl.dtype):
            enc.append([key, {"__tl_dtype__": v.name}])
        elif v is None or isinstance(v, (bool, int, float, str)):
            enc.append([key, v])
        else:
            raise TypeError(f"kogc aot: TRITON_INTERPRET is on, so compilation runs in a subprocess and the "
                            f"constexpr {k!r}={v!r} must be None/bool/int/float/str or a tl dtype")
    return enc


def _decode_constexprs(enc: list) -> dict:
    import triton.language as tl
    out = {}
    for key, v in enc:
        if isinstance(v, dict) and "__tl_dtype__" in v:
            v = tl.dtype(v["__tl_dtype__"])
        out[key if isinstance(key, str) else tuple(key)] = v
    return out


def _compile_in_subprocess(source_path, kernel_name, signature, constexprs, target, out_dir, num_warps,
                           aligned_args, options):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    job = {
        "source_path": str(Path(source_path).resolve()), "kernel_name": kernel_name, "signature": signature,
        "constexprs": _encode_constexprs(constexprs), "target": target, "out_dir": str(Path(out_dir).resolve()),
        "num_warps": num_warps, "aligned_args": aligned_args, "options": options,
    }
    with tempfile.TemporaryDirectory(prefix="kogc_aot_") as tmp:
        job_path, res_path = Path(tmp, "job.json"), Path(tmp, "result.json")
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(job_path),
                               str(res_path)], env=env, capture_output=True, text=True)
        if not res_path.exists():
            raise RuntimeError(f"kogc aot: compile subprocess for target {target[0]!r} died (rc={proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        res = json.loads(res_path.read_text())
    if "error" in res:
        exc = _PASSED_ERRORS.get(res.get("type"), RuntimeError)
        raise exc(res["error"])
    return res["paths"]


_PASSED_ERRORS = {e.__name__: e for e in (RuntimeError, ValueError, TypeError, FileNotFoundError, AttributeError)}


def _worker_main(job_path: str, res_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    try:
        paths = _compile_in_process(job["source_path"], job["kernel_name"], job["signature"],
                                    _decode_constexprs(job["constexprs"]), job["target"], job["out_dir"],
                                    job["num_warps"], job["aligned_args"], job["options"])
        res = {"paths": paths}
    except Exception as e:
        known = type(e).__name__ in _PASSED_ERRORS
        res = {"error": str(e) if known else f"{type(e).__name__}: {e}",
               "type": type(e).__name__ if known else "RuntimeError"}
    Path(res_path).write_text(json.dumps(res))


# --------------------------------------------------------------------------- public API
def compile_kernel(source_path: str, kernel_name: str, signature: dict[str, str], constexprs: dict[str, object],
                   target: str, out_dir: str, num_warps: int = 4, aligned_args: list[str] | None = None,
                   options: dict | None = None) -> dict[str, str]:
    """Compile ``kernel_name`` from ``source_path`` ahead of time, without a GPU.

    target (a name, or a kogc.targets Target whose .name is one):
    target 'h200'   -> GPUTarget('cuda', 90, 32); writes <kernel_name>.ttir/.ttgir/.llir/.ptx/.cubin
    target 'mi300x' -> GPUTarget('hip', 'gfx942', 64); writes .ttir/.ttgir/.llir/.amdgcn/.hsaco
    Also writes <kernel_name>.json (Triton's metadata: shared memory, num_warps, ...).

    signature: {arg name: type string} e.g. {"X": "*fp16", "n": "i32", "BLOCK": "constexpr"};
      constexpr args may be left out (they are added from ``constexprs``).
    constexprs: {arg name or index tuple: value}.
    aligned_args: pointer args Triton may assume 16-byte aligned (default: all pointer args,
      what the runtime JIT assumes for torch tensors). Pass [] for no alignment assumption.
    options: extra Triton backend options (e.g. {"num_stages": 1}).

    Returns {artifact kind: path} (kinds above plus 'metadata'). Raises RuntimeError naming the
    target and the Triton error when compilation fails; ValueError for bad arguments.
    If TRITON_INTERPRET is on, the compilation runs in a child process with it unset.
    """
    from ..targets import Target, get_target      # (here, not at the top: the worker runs this file alone)
    try:
        tgt = target if isinstance(target, Target) else get_target(target)
    except KeyError as e:
        raise ValueError(f"kogc aot: {e.args[0]}") from None
    spec = [tgt.name, tgt.triton_backend, tgt.triton_arch, tgt.warp_size]
    args = (source_path, kernel_name, dict(signature), dict(constexprs), spec, out_dir, num_warps,
            None if aligned_args is None else list(aligned_args), options)
    if _interpret_on():
        return _compile_in_subprocess(*args)
    return _compile_in_process(*args)


def _read(v) -> str | bytes | None:
    if isinstance(v, bytes):
        return v
    if isinstance(v, (str, Path)) and "\n" not in str(v) and Path(v).is_file():
        p = Path(v)
        return p.read_bytes() if p.suffix[1:] in BINARY_KINDS else p.read_text()
    return v if isinstance(v, str) else None


def _nvidia_tool(name: str) -> str | None:
    try:
        import triton
        path = getattr(triton.knobs.nvidia, name).path
        if path and os.path.exists(path):
            return path
    except Exception:
        pass
    try:
        import triton
        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if p.exists():
            return str(p)
    except Exception:
        pass
    return shutil.which(name)


_PTX_LD = re.compile(r"^\s*(?:@!?%\w+\s+)?ld\.global((?:\.[\w:]+)*)\s", re.M)
_PTX_ATOM = re.compile(r"^\s*(?:@!?%\w+\s+)?(atom|red)((?:\.[\w:]+)*)\s", re.M)
_PTX_ST = re.compile(r"^\s*(?:@!?%\w+\s+)?st\.global((?:\.[\w:]+)*)\s", re.M)


def _ptx_width(mods: str) -> int:
    parts = mods.split(".")
    vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d+", p)), 1)
    bits = next((int(m.group(1)) for p in parts if (m := re.fullmatch(r"[bsuf](\d+)", p))), 0)
    return vec * bits


def _summarise_ptx(ptx: str, s: dict) -> None:
    loads = _PTX_LD.findall(ptx)
    widths: dict[int, int] = {}
    for m in loads:
        w = _ptx_width(m)
        widths[w] = widths.get(w, 0) + 1
    s["ld_global"] = len(loads)
    s["ld_global_128"] = widths.get(128, 0)
    s["ld_global_bits"] = dict(sorted(widths.items()))
    s["ld_global_acquire"] = sum(".acquire" in m for m in loads)
    s["ld_global_volatile"] = sum(".volatile" in m for m in loads)
    stores = _PTX_ST.findall(ptx)
    s["st_global"] = len(stores)
    atoms = _PTX_ATOM.findall(ptx)
    s["atom"] = len(atoms)
    s["atom_acquire"] = sum(".acquire" in m or ".acq_rel" in m for _, m in atoms)
    s["atom_release"] = sum(".release" in m or ".acq_rel" in m for _, m in atoms)
    s["bar_sync"] = len(re.findall(r"^\s*(?:@!?%\w+\s+)?bar(?:rier)?\.sync", ptx, re.M))
    s["fence"] = len(re.findall(r"^\s*fence\.", ptx, re.M))
    s["prefetch_l2"] = len(re.findall(r"\bprefetch\.global\.L2\b", ptx))
    s["has_acquire_load"] = s["ld_global_acquire"] > 0 or s["atom_acquire"] > 0
    s["has_release_atomic"] = s["atom_release"] > 0


def _summarise_cubin(cubin_path: str, ptx_path: str | None, s: dict) -> None:
    cuobjdump = _nvidia_tool("cuobjdump")
    if cuobjdump:
        try:
            out = subprocess.run([cuobjdump, "-res-usage", cubin_path], capture_output=True, text=True,
                                 timeout=60).stdout
            m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", out)
            if m:
                s["registers"], s["stack_bytes"], s["shared_bytes"], s["local_bytes"] = map(int, m.groups())
            sass = subprocess.run([cuobjdump, "-sass", cubin_path], capture_output=True, text=True,
                                  timeout=60).stdout
            ldg = re.findall(r"\bLDG\.[\w.]*", sass)
            if ldg:
                s["sass_ldg"] = len(ldg)
                s["sass_ldg_128"] = sum(".128" in x for x in ldg)
        except Exception:
            pass
    ptxas = _nvidia_tool("ptxas")
    if ptxas and ptx_path and Path(ptx_path).is_file():
        try:
            arch = re.search(r"^\.target\s+(sm_\w+)", Path(ptx_path).read_text(), re.M)
            with tempfile.TemporaryDirectory() as tmp:
                out = subprocess.run([ptxas, "-v", f"--gpu-name={arch.group(1) if arch else 'sm_90a'}", ptx_path,
                                      "-o", os.path.join(tmp, "k.o")], capture_output=True, text=True,
                                     timeout=300).stderr
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
            if m:
                s["spill_store_bytes"], s["spill_load_bytes"] = map(int, m.groups())
            m = re.search(r"Used (\d+) registers", out)
            if m:
                s.setdefault("registers", int(m.group(1)))
        except Exception:
            pass


def _summarise_amdgcn(asm: str, s: dict) -> None:
    instr = [ln.split()[0] for ln in asm.splitlines() if ln.startswith("\t") and ln.split()
             and not ln.split()[0].startswith(".") and not ln.lstrip().startswith(";")]
    s["global_load"] = sum(i.startswith("global_load") for i in instr)
    s["global_load_dwordx4"] = sum(i == "global_load_dwordx4" for i in instr)
    s["buffer_load"] = sum(i.startswith("buffer_load") for i in instr)
    s["buffer_load_dwordx4"] = sum(i == "buffer_load_dwordx4" for i in instr)
    s["s_waitcnt"] = sum(i == "s_waitcnt" for i in instr)
    s["atomics"] = sum("atomic" in i for i in instr)
    s["buffer_inv"] = sum(i == "buffer_inv" for i in instr)      # acquire side (cache invalidate)
    s["buffer_wbl2"] = sum(i == "buffer_wbl2" for i in instr)    # release side (L2 write-back)
    for key, pat in (("vgprs", r"\.vgpr_count:\s+(\d+)"), ("sgprs", r"\.sgpr_count:\s+(\d+)"),
                     ("vgpr_spills", r"\.vgpr_spill_count:\s+(\d+)"), ("sgpr_spills", r"\.sgpr_spill_count:\s+(\d+)"),
                     ("scratch_bytes", r"; ScratchSize:\s+(\d+)"), ("occupancy", r"; Occupancy:\s+(\d+)")):
        m = re.search(pat, asm)
        if m:
            s[key] = int(m.group(1))


def disassembly_summary(artifacts) -> dict:
    """Summarise what ``compile_kernel`` produced. ``artifacts`` maps kind -> path (or text/bytes).

    cuda (from PTX): ld_global, ld_global_128, ld_global_bits {bits: count}, ld_global_acquire,
      atom, atom_acquire, atom_release, st_global, bar_sync, fence, prefetch_l2, has_acquire_load,
      has_release_atomic; from the cubin when the bundled tools exist: registers, stack_bytes,
      shared_bytes, local_bytes, sass_ldg, sass_ldg_128, spill_store_bytes, spill_load_bytes.
    hip (from AMDGCN): global_load, global_load_dwordx4, buffer_load(_dwordx4), s_waitcnt, atomics,
      buffer_inv, buffer_wbl2, vgprs, sgprs, vgpr_spills, sgpr_spills, scratch_bytes, occupancy.
    Fields whose source (artifact or tool) is missing are omitted.
    """
    s: dict = {}
    ptx = _read(artifacts.get("ptx")) if "ptx" in artifacts else None
    if isinstance(ptx, str):
        s["backend"] = "cuda"
        _summarise_ptx(ptx, s)
    cubin = artifacts.get("cubin")
    if isinstance(cubin, (str, Path)) and Path(cubin).is_file():
        s["backend"] = "cuda"
        ptx_path = artifacts.get("ptx")
        _summarise_cubin(str(cubin), str(ptx_path) if isinstance(ptx_path, (str, Path)) else None, s)
    amdgcn = _read(artifacts.get("amdgcn")) if "amdgcn" in artifacts else None
    if isinstance(amdgcn, str):
        s["backend"] = "hip"
        _summarise_amdgcn(amdgcn, s)
    for kind in BINARY_KINDS:
        data = _read(artifacts.get(kind)) if kind in artifacts else None
        if isinstance(data, bytes):
            s[f"{kind}_bytes"] = len(data)
    return s


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker_main(sys.argv[2], sys.argv[3])
