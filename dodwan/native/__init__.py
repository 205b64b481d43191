"""The protocol core compiled with mypyc, used only when built from the sources at hand.

``python -m dodwan.native build`` (run by ``make setup``) compiles the modules of
:mod:`dodwan.core` (all but its ``__init__``), with the simulator's modules on its
per-datagram path (:data:`SIM_MODULES`: the radio medium, the host adapter, the log
columns), with mypyc into ``build/native/``, outside the source tree, and writes there a
manifest: the interpreter it was built for and the SHA-256 of every source file it was
built from. When :mod:`dodwan` is imported (:mod:`sim` imports it first), :func:`activate`
puts that build in front of the sources (an import hook for those modules alone) if and
only if:

* ``DODWAN_NATIVE`` is not ``0`` (set it to run pure Python);
* the manifest names this interpreter's extension suffix;
* every source file it lists still has the digest it was built from, and no core module
  was added or removed since.

Otherwise the pure Python modules run, all of them, and :func:`status` says why. An edit
to a compiled module therefore takes effect at once (in pure Python) until the next build:
a stale build is never used. The two run the same code and give the same results, byte for
byte (``tests/test_native.py`` compares a simulation's logs); the compiled one runs the
simulator's ONE-default workload in under half the CPU time (2 h of it: 24 s against 54 s)
(``docs/performance.md``).

Compiled code checks argument and attribute types at run time where Python does not; the
core's tests run against both builds (``make test``), and the compiled modules are type
checked strictly (``mypy``, ``pyproject.toml``).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent
CORE = ROOT / "dodwan" / "core"
BUILD = ROOT / "build" / "native"
MANIFEST = "manifest.json"
ENV = "DODWAN_NATIVE"
PACKAGE = "dodwan.core"

_active: dict[str, Path] | None = None
_reason = "not checked yet"


SIM = ROOT / "sim"
SIM_MODULES = ("medium", "host", "logs")
"""The simulator's modules on its per-datagram path (the radio, the SimPy adapter around a
node, the log columns), compiled with the core: a fragment crosses them on every hop."""


def sources(core: Path = CORE, sim: Path | None = SIM) -> dict[str, Path]:
    """Module name -> source file, for what mypyc compiles: every core module (every
    ``.py`` of the package but ``__init__``) and the simulator's :data:`SIM_MODULES`."""
    found = {f"{PACKAGE}.{p.stem}": p for p in sorted(core.glob("*.py")) if p.name != "__init__.py"}
    if sim is not None:
        for name in SIM_MODULES:
            path = sim / f"{name}.py"
            if path.is_file():
                found[f"sim.{name}"] = path
    return found


def digests(paths: Mapping[str, Path]) -> dict[str, str]:
    """Module name -> SHA-256 of its source file's bytes."""
    return {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def status(
    build: Path = BUILD, core: Path = CORE, sim: Path | None = SIM
) -> tuple[dict[str, Path] | None, str]:
    """``(module name -> compiled file, reason)`` if the build at ``build`` may be used for
    the sources in ``core``, else ``(None, why not)``."""
    if os.environ.get(ENV, "1") == "0":
        return None, f"{ENV}=0"
    try:
        manifest = json.loads((build / MANIFEST).read_text())
    except FileNotFoundError:
        return None, f"no native build in {build} (run `python -m dodwan.native build`)"
    except (OSError, ValueError) as e:
        return None, f"unreadable manifest in {build}: {e}"
    if manifest.get("suffix") != _suffix():
        return None, f"built for {manifest.get('suffix')}, this interpreter loads {_suffix()}"
    built = manifest.get("sources", {})
    now = digests(sources(core, sim))
    if built != now:
        changed = sorted(set(built) ^ set(now) | {n for n in built if built[n] != now.get(n)})
        return None, "sources changed since the native build: " + ", ".join(changed)
    modules: dict[str, Path] = {}
    for name in now:
        *package, leaf = name.split(".")
        modules[name] = build.joinpath(*package, leaf + _suffix())
    for group in manifest.get("groups", []):
        modules[group] = build / (group + _suffix())
    missing = [str(p) for p in modules.values() if not p.is_file()]
    if missing:
        return None, "native build incomplete, missing " + ", ".join(missing)
    return modules, f"native build of {len(now)} modules in {build}"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and mypyc's shared library) in the build."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = modules

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        where = self.modules.get(fullname)
        if where is None:
            return None
        return importlib.util.spec_from_file_location(fullname, where)


def activate() -> bool:
    """Use the native build for :mod:`dodwan.core` if :func:`status` allows it. Must run
    before any core module is imported (``dodwan/__init__.py`` calls it first)."""
    global _active, _reason
    if _active is not None:
        return True
    modules, _reason = status()
    if modules is None:
        return False
    if any(name in sys.modules for name in modules):
        _reason = "compiled modules were imported before the native build could be put first"
        return False
    _active = modules
    sys.meta_path.insert(0, _Finder(modules))
    return True


def active() -> bool:
    """Whether this process runs the compiled core."""
    return _active is not None


def describe() -> str:
    """One line: which core this process runs, and why."""
    return ("compiled core: " if active() else "pure Python core: ") + _reason


_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
*paths, c_dir, lib_dir, temp_dir = sys.argv[1:]
setup(
    name="dodwan-native",
    ext_modules=mypycify(paths, opt_level="3", target_dir=c_dir),
    script_args=["build_ext", "--build-lib", lib_dir, "--build-temp", temp_dir],
    py_modules=[],
)
""".strip()


def build(out: Path = BUILD, quiet: bool = True) -> None:
    """Compile the core into ``out`` (replaced only once the whole build succeeded)."""
    import shutil  # here, not at the top: every ``import dodwan`` loads this module
    import subprocess
    import tempfile

    paths = sources()
    manifest = {"suffix": _suffix(), "sources": digests(paths)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="native-", dir=out.parent) as tmp:
        work = Path(tmp)
        lib = work / "lib"
        cmd = [
            sys.executable,
            "-c",
            _SETUP,
            *(str(p.relative_to(ROOT)) for p in paths.values()),
            str(work / "c"),
            str(lib),
            str(work / "temp"),
        ]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=quiet, text=True, check=False)
        if done.returncode != 0:
            detail = (done.stdout + done.stderr)[-4000:] if quiet else ""
            raise RuntimeError(f"mypyc failed (exit {done.returncode})\n{detail}")
        manifest["groups"] = sorted(
            p.name[: -len(_suffix())] for p in lib.glob("*__mypyc" + _suffix())
        )
        (lib / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        old = work / "old"
        if out.exists():
            out.rename(old)
        lib.rename(out)
        shutil.rmtree(old, ignore_errors=True)
