"""Generated source -> a callable @triton.jit kernel, through one bounded cache folder.

Triton's @jit reads a function's source with `inspect` when it decorates it (and the interpreter again
when it first runs it), so a generated kernel must come from a file. Every source goes to one folder,
`$KOGC_CACHE_DIR` or `~/.cache/kogc/kernels` (`$XDG_CACHE_HOME/kogc/kernels` where that is set), named
by its digest: the same source is written once and reused (its mtime touched). The folder keeps at most
`$KOGC_CACHE_MAX_FILES` files (64) and `$KOGC_CACHE_MAX_BYTES` bytes (256 MiB), evicting the least
recently used. Loaded kernels are kept in an in-process LRU keyed by (digest, interpret), never in
`sys.modules`. A kernel does not need its file once loaded: the source is handed to `inspect` from
memory while the module runs, and interpreted functions are rewritten then, so a later eviction (by
this process or another sharing the folder) breaks nothing already loaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import tempfile
import threading
import time
import types
from collections import OrderedDict

import numpy as np
import triton

from ..errors import KogcError
from .interpret_once import install as install_interpret_once
from .render import KERNEL_NAME

DEFAULT_MAX_FILES = 64
DEFAULT_MAX_BYTES = 256 * 2**20
MAX_LOADED = 32                 # kernels kept loaded in this process (a CompiledKernel holds its own)
PREFIX, SUFFIX = "kogc_", ".py"

_loaded: OrderedDict[tuple[str, bool], dict] = OrderedDict()   # (digest, interpret) -> module namespace
_lock = threading.RLock()
_last_stamp = 0


@contextlib.contextmanager
def interpreter(on: bool):
    """Triton reads its interpret switch when a function is decorated and again when an interpreted
    kernel calls its helpers: hold it for both, and restore it after. Interpreted, numpy's warning on a
    log of 0 is silenced: the GPU computes -inf there without a word (attention's log-sum of a split with
    no positions, discarded by a select), and numpy would print it at every such split."""
    knobs = triton.knobs.runtime
    before = knobs.interpret
    knobs.interpret = on
    if on:
        install_interpret_once()
    try:
        with np.errstate(divide="ignore") if on else contextlib.nullcontext():
            yield
    finally:
        knobs.interpret = before


def interpreter_ready() -> bool:
    """Triton's own helpers (tl.sum, ...) are decorated when triton is imported: the interpreter
    works only if TRITON_INTERPRET=1 was set before that."""
    import triton.language as tl
    return type(tl.sum).__name__ == "InterpretedFunction"


def cache_dir() -> str:
    """The folder generated sources go to (created): $KOGC_CACHE_DIR, else ~/.cache/kogc/kernels."""
    folder = os.environ.get("KOGC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kogc", "kernels")
    os.makedirs(folder, exist_ok=True)
    return folder


def _limit(var: str, default: int) -> int:
    text = os.environ.get(var)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise KogcError(f"{var}={text!r} is not a whole number") from None
    if value < 1:
        raise KogcError(f"{var}={value} must be at least 1")
    return value


def cache_limits() -> tuple[int, int]:
    """(most files, most bytes) the folder keeps: $KOGC_CACHE_MAX_FILES, $KOGC_CACHE_MAX_BYTES."""
    return _limit("KOGC_CACHE_MAX_FILES", DEFAULT_MAX_FILES), _limit("KOGC_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)


def _store(source: str, digest: str, folder: str) -> str:
    """The source's file in the folder: written if absent (atomically: other processes share the
    folder), else touched as just used; then the folder is trimmed to its bounds."""
    path = os.path.join(folder, f"{PREFIX}{digest}{SUFFIX}")
    try:
        _touch(path)
        return path
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=SUFFIX)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        _touch(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    evict(folder, keep=path)
    return path


def _touch(path: str) -> None:
    """Mark a file as just used. The clock is read here, at full resolution (a file system stamps with
    a coarse clock: files written in one tick would tie), and never repeats within this process."""
    global _last_stamp
    with _lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        os.utime(path, ns=(_last_stamp, _last_stamp))


def evict(folder: str, keep: str | None = None) -> list[str]:
    """Remove the least recently used sources (oldest mtime first) until the folder holds at most the
    bounds' files and bytes; `keep` (the file just written) stays. Returns the paths removed."""
    max_files, max_bytes = cache_limits()
    entries = []
    with os.scandir(folder) as it:
        for e in it:
            if e.name.startswith(PREFIX) and e.name.endswith(SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    entries.append((st.st_mtime_ns, e.path, st.st_size))
    entries.sort()
    count, total = len(entries), sum(size for _, _, size in entries)
    removed = []
    for _, path, size in entries:
        if count <= max_files and total <= max_bytes:
            break
        if path == keep:
            continue
        with contextlib.suppress(FileNotFoundError):    # another process may have removed it first
            os.remove(path)
            removed.append(path)
        count, total = count - 1, total - size
    return removed


def _execute(source: str, path: str, digest: str, interpret: bool) -> dict:
    """Run the generated module's code (not registered in sys.modules) and return its namespace."""
    # inspect finds the source in linecache (an entry with no mtime is never checked against the file)
    lines = source.splitlines(keepends=True)
    linecache.cache[path] = (len(source), None, lines, path)
    try:
        module = types.ModuleType(f"kogc_gen_{digest}_{'interp' if interpret else 'jit'}")
        module.__file__ = path
        namespace = module.__dict__
        with interpreter(interpret):
            exec(compile(source, path, "exec"), namespace)
            if interpret:
                # the interpreter reads a function's source on its first call: do it now, while the
                # source is at hand (a helper first called in a later launch would otherwise need the file)
                from triton.runtime.interpreter import InterpretedFunction
                for value in list(namespace.values()):
                    if isinstance(value, InterpretedFunction):
                        value.rewrite()
    finally:
        if linecache.cache.get(path, (None, None, None))[2] is lines:
            del linecache.cache[path]
    return namespace


def load_kernel(source: str, interpret: bool, name: str = KERNEL_NAME):
    """(the @triton.jit function `name` of the generated source, its file in the cache folder).
    `interpret` decides (at decoration time) whether @triton.jit gives Triton's CPU interpreter or a
    GPU kernel. The same source and `interpret` give the same function object while it stays in the
    in-process LRU."""
    if interpret and not interpreter_ready():
        raise KogcError("running under Triton's interpreter needs TRITON_INTERPRET=1 in the environment before "
                        "triton is imported (run as `TRITON_INTERPRET=1 python ...`)")
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    key = (digest, bool(interpret))
    with _lock:
        path = _store(source, digest, cache_dir())
        namespace = _loaded.get(key)
        if namespace is None:
            namespace = _execute(source, path, digest, bool(interpret))
            _loaded[key] = namespace
            while len(_loaded) > MAX_LOADED:
                _loaded.popitem(last=False)
        else:
            _loaded.move_to_end(key)
    if name not in namespace:
        raise KogcError(f"generated source {path} defines no {name!r}")
    return namespace[name], path


def clear_loaded() -> None:
    """Forget the in-process kernels (kernels already handed out keep working)."""
    with _lock:
        _loaded.clear()
