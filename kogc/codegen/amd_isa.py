"""The gfx942 (MI300X) synchronisation, checked in the code Triton generates (its AMDGCN assembly and
TTIR), ahead of time: no AMD GPU needed.

On MI300X each XCD has its own L2, so a flag another XCD reads (every counter: programs of one kernel
sit on all 8 XCDs) needs agent scope, and the data it guards must be written back from the writer's L2
before the flag is raised; the reader must invalidate its caches after seeing the flag and before it
loads the data. The rules (LLVM's AMDGPU memory model for GFX940-942, agent and system scope):

- publish: before the barrier that precedes a counter add, every wave writes its L2 back at agent (or
  system) scope (`buffer_wbl2 sc1`, or `sc0 sc1`) and waits for it (`s_waitcnt vmcnt(0)`); no global
  store comes between that and the add;
- acquire: a load of a counter at agent (or system) scope (`sc1`) is waited for and followed by
  `buffer_inv sc1` (or `sc0 sc1`) before any other global load;
- and Triton 3.6's known AMD problems stay avoided: no volatile loads, no tensor atomics with a
  memory order other than relaxed (checked in the TTIR).
"""
from __future__ import annotations

import re

_SCOPES = ("sc1", "sc0 sc1")      # agent, system: what another XCD (or GPU) sees


_LOC = re.compile(r"^\s*\.loc\s+\d+\s+(\d+)\s")


def instructions(asm: str, source: str | None = None) -> list[str]:
    """The instruction lines of an AMDGCN listing (comments, directives and labels dropped), stripped.
    With the kernel's `source`, each is followed by " ## " and the source line it was compiled from
    (the listing's .loc), so that a rule can tell an acquire from a relaxed load of the same form."""
    src = source.splitlines() if source else None
    out, line_no = [], 0
    for line in asm.splitlines():
        m = _LOC.match(line)
        if m:
            line_no = int(m.group(1))
            continue
        s = line.split(";", 1)[0].strip()
        if not s or s.startswith(".") or s.endswith(":"):
            continue
        if src is not None:
            s += " ## " + (src[line_no - 1].strip() if 0 < line_no <= len(src) else "")
        out.append(s)
    return out


def _op(x: str) -> str:
    return x.split(" ## ", 1)[0]


def _from(x: str, what: str) -> bool:
    return " ## " in x and what in x.split(" ## ", 1)[1]


def _has_scope(ins: str, scopes=_SCOPES) -> bool:
    words = ins.split()
    return any(" ".join(words[-len(s.split()):]) == s for s in scopes) or ("sc1" in words)


def publish_problems(ins: list[str]) -> list[str]:
    """Counter publishes (`global_atomic_add` with no return: the kernel's only ones) without the
    written-back, waited-for stores before their barrier."""
    problems = []
    for i, x in enumerate(ins):
        if not (x.startswith("global_atomic_add ") and _from(x, 'sem="release"')):
            continue
        j = i - 1
        while j >= 0 and _op(ins[j]) != "s_barrier":
            if ins[j].startswith(("global_store", "buffer_store", "flat_store")):
                break
            j -= 1
        if j < 0 or _op(ins[j]) != "s_barrier":
            problems.append(f"instruction {i}: {x}: no barrier before it (a store comes first)")
            continue
        # before the barrier: a scoped writeback, then a wait for it, with no store after the writeback
        k, waited = j - 1, False
        while k >= 0:
            y = _op(ins[k])
            if y.startswith("s_waitcnt") and "vmcnt(0)" in y:
                waited = True
            elif y.startswith("buffer_wbl2"):
                if not waited:
                    problems.append(f"instruction {i}: {x}: the writeback before its barrier is not waited for")
                elif y.split()[1:] not in (["sc1"], ["sc0", "sc1"]):
                    problems.append(f"instruction {i}: {x}: the writeback before its barrier has scope "
                                    f"{' '.join(y.split()[1:]) or 'none'} (needs agent: sc1, or system: sc0 sc1)")
                break
            elif y.startswith(("global_store", "buffer_store", "flat_store", "global_atomic")) or y == "s_barrier":
                problems.append(f"instruction {i}: {x}: no agent- or system-scope writeback between the last "
                                f"store and its barrier")
                break
            k -= 1
        else:
            problems.append(f"instruction {i}: {x}: no writeback before its barrier")
    return problems


def acquire_problems(ins: list[str]) -> list[str]:
    """Acquire loads of counters (from a `sem="acquire"` source line) without agent (or system) scope,
    or not followed, before the next global load, by a wait and `buffer_inv sc1` (or `sc0 sc1`)."""
    problems = []
    for i, x in enumerate(ins):
        if not (x.startswith(("global_load", "global_atomic")) and _from(x, 'sem="acquire"')):
            continue
        if _op(x).split()[-1] != "sc1":
            problems.append(f"instruction {i}: {_op(x)}: an acquire without agent or system scope")
            continue
        waited = False
        for y in (_op(y) for y in ins[i + 1:i + 40]):
            if y.startswith("s_waitcnt") and "vmcnt(0)" in y:
                waited = True
            elif y.startswith("buffer_inv"):
                if not waited or y.split()[1:] not in (["sc1"], ["sc0", "sc1"]):
                    problems.append(f"instruction {i}: {x}: followed by {y} without a wait or agent scope")
                break
            elif y.startswith(("global_load", "buffer_load", "flat_load")):
                problems.append(f"instruction {i}: {x}: a load ({y}) before the invalidate")
                break
        else:
            problems.append(f"instruction {i}: {x}: no invalidate after it")
    return problems


_TENSOR_ATOMIC = re.compile(r"tt\.atomic_(rmw|cas)\s+(?:\w+,\s*)?(\w+),.*->\s*tensor<")


def ttir_problems(ttir: str) -> list[str]:
    """Volatile loads, and tensor atomics with a memory order other than relaxed (both wrong on AMD in
    Triton 3.6)."""
    problems = []
    for n, line in enumerate(ttir.splitlines(), 1):
        if "tt.load" in line and "isVolatile = true" in line:
            problems.append(f"ttir line {n}: a volatile load")
        m = _TENSOR_ATOMIC.search(line)
        if m and m.group(2) != "relaxed":
            problems.append(f"ttir line {n}: a tensor atomic with order {m.group(2)}")
    return problems


def check(asm: str, ttir: str, source: str) -> dict:
    """{"publishes": n, "acquires": n, "problems": [...]} for one gfx942 build (`source`: its kernel.py)."""
    ins = instructions(asm, source)
    return {"publishes": sum(1 for x in ins if x.startswith("global_atomic_add ") and _from(x, 'sem="release"')),
            "acquires": sum(1 for x in ins if x.startswith(("global_load", "global_atomic")) and _from(x, 'sem="acquire"')),
            "problems": publish_problems(ins) + acquire_problems(ins) + ttir_problems(ttir)}
