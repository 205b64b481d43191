"""Parameter sweeps: one scenario, the cross product of settings × seeds, one run each.

A setting assigns values to dotted key paths of the scenario (``protocol.horizon``,
``groups[0].mobility.speed``, ``groups.walker.count``, ``traffic.publish[0].interval``...).
Values are applied to the parsed TOML before the scenario is validated, so any key the
scenario format knows can be swept and a bad value is reported like a bad file.

Runs land in ``OUT/runs/<setting>/seed-<n>/`` with a ``_SUCCESS`` marker written after the
logs and ``run.json`` are complete; a run with a marker is never run again (resume by
running the same command). ``OUT/sweep.json`` describes the sweep for ``analyze``.
The same (setting, seed) always gives the same logs: the seed is the only source of
randomness and every setting uses the same seeds (common random numbers).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any

from sim.scenario import Scenario, ScenarioError, from_data, input_digests

MANIFEST = "sweep.json"
"""The sweep's description, at the root of the output folder."""
MARKER = "_SUCCESS"
"""Written into a run folder once its logs are complete (the Hadoop convention)."""
SWEEP_VERSION = 1


class SweepError(Exception):
    """A sweep that cannot be run (bad key, bad value, unusable output folder...)."""


# --------------------------------------------------------------------------- keys and values


def parse_values(text: str) -> list[Any]:
    """``"1,2,3"`` -> [1, 2, 3]; items are TOML values (``true``, ``2.5``, ``[0.5, 2.0]``,
    ``"x"``); an item that is not valid TOML is taken as a bare string (``poisson``)."""
    try:
        values = tomllib.loads(f"v = [{text}]")["v"]
    except tomllib.TOMLDecodeError:
        values = []
        for item in _split_top(text):
            try:
                values.append(tomllib.loads(f"v = {item}")["v"])
            except tomllib.TOMLDecodeError:
                values.append(item.strip())
    if not values or any(v == "" for v in values):
        raise SweepError(f"no usable values in {text!r} (expected v1,v2,...)")
    return list(values)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets, braces or quotes."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return out


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def key_path(key: str) -> list[str | int]:
    """``groups[0].mobility.speed`` -> ["groups", 0, "mobility", "speed"]."""
    parts: list[str | int] = []
    pos = 0
    key = key.strip()
    while pos < len(key):
        if key[pos] == "." and parts:
            pos += 1
        m = _SEGMENT.match(key, pos)
        if m is None:
            raise SweepError(f"bad key {key!r}: expected dotted names and [index]es")
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if not parts or not isinstance(parts[0], str):
        raise SweepError(f"bad key {key!r}")
    if parts[0] in ("seed", "sweep"):
        raise SweepError(f"{key!r} cannot be swept (use --seeds for seeds)")
    return parts


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Assign ``value`` at ``key`` in parsed TOML, creating missing tables on the way.

    In an array of tables a name selects the entry with that ``name`` (``groups.walker``).
    """
    path = key_path(key)
    cur: Any = data
    for i, seg in enumerate(path):
        last = i == len(path) - 1
        where = ".".join(map(str, path[: i + 1]))
        if isinstance(cur, list):
            if isinstance(seg, str):
                hits = [x for x in cur if isinstance(x, dict) and x.get("name") == seg]
                if len(hits) != 1:
                    raise SweepError(f"{key}: no single entry named {seg!r} at {where}")
                idx = cur.index(hits[0])
            else:
                idx = seg
                if idx >= len(cur):
                    raise SweepError(f"{key}: {where} is out of range ({len(cur)} entries)")
            if last:
                cur[idx] = value
            else:
                cur = cur[idx]
            continue
        if not isinstance(cur, dict) or isinstance(seg, int):
            raise SweepError(f"{key}: {where} does not name a table entry")
        if last:
            cur[seg] = value
        else:
            cur = cur.setdefault(seg, {})


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Setting:
    """One point of the grid: (key, value) pairs in the order the keys were given."""

    values: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def label(self) -> str:
        return ", ".join(f"{k}={_text(v)}" for k, v in self.values) or "(base)"

    def slug(self) -> str:
        """A folder name: readable, stable, unique per setting."""
        raw = ",".join(f"{k}={_text(v)}" for k, v in self.values) or "base"
        safe = re.sub(r"[^A-Za-z0-9_.=,+-]+", "_", raw)
        if len(safe) > 100 or safe != raw:
            digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
            safe = f"{safe[:90]}~{digest}"
        return safe


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


@dataclass(frozen=True)
class RunSpec:
    """One simulation of the sweep."""

    setting: Setting
    seed: int

    @property
    def rel(self) -> str:
        """Folder of the run under the output folder."""
        return f"runs/{self.setting.slug()}/seed-{self.seed}"


@dataclass
class Plan:
    """A checked sweep: every setting has been validated against the scenario."""

    text: str
    source: Path
    name: str
    keys: list[str]
    values: dict[str, list[Any]]
    seeds: list[int]
    settings: list[Setting] = field(default_factory=list)
    inputs: list[dict[str, str]] = field(default_factory=list)
    """Every file some setting's runs read (:func:`sim.scenario.input_files`), once each:
    ``{"key", "file" (relative to the scenario's folder when in it), "sha256"}``."""

    def runs(self) -> list[RunSpec]:
        return [RunSpec(s, seed) for s in self.settings for seed in self.seeds]

    def manifest(self) -> dict[str, Any]:
        return {
            "sweep_version": SWEEP_VERSION,
            "scenario": self.name,
            "scenario_file": str(self.source),
            "scenario_sha256": hashlib.sha256(self.text.encode()).hexdigest(),
            "runs_sha256": runs_digest(self.text),
            "inputs": self.inputs,
            "keys": self.keys,
            "values": self.values,
            "seeds": self.seeds,
            "runs": [
                {"dir": r.rel, "seed": r.seed, "setting": r.setting.as_dict()} for r in self.runs()
            ],
        }


def runs_digest(text: str) -> str:
    """SHA-256 of what a run depends on: the parsed scenario without its ``[sweep]`` table
    (which only chooses the runs), so comments, layout and [sweep] edits leave it alone."""
    data = tomllib.loads(text)
    data.pop("sweep", None)
    canon = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def scenario_for(text: str, source: Path, setting: Setting) -> Scenario:
    """The scenario of one setting (raises ScenarioError / SweepError)."""
    data = tomllib.loads(text)
    for key, value in setting.values:
        set_key(data, key, copy.deepcopy(value))
    return from_data(data, text, source)


def _file_sweep(data: Mapping[str, Any], source: Path) -> tuple[dict[str, list[Any]], Any]:
    raw = data.get("sweep", {})
    if not isinstance(raw, dict):
        raise SweepError(f"{source}: [sweep] must be a table")
    unknown = set(raw) - {"set", "seeds"}
    if unknown:
        raise SweepError(f"{source}: [sweep] has unknown key(s) {sorted(unknown)} (set, seeds)")
    sets = raw.get("set", {})
    if not isinstance(sets, dict):
        raise SweepError(f'{source}: sweep.set must be a table of "key" = [values]')
    out: dict[str, list[Any]] = {}
    for k, v in _flatten(sets):
        if not isinstance(v, list) or not v:
            raise SweepError(f"{source}: sweep.set.{k} must be a non-empty list of values")
        out[k] = v
    return out, raw.get("seeds")


def _flatten(t: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``{"protocol": {"horizon": [1, 2]}}`` and ``{"protocol.horizon": [1, 2]}`` alike."""
    for k, v in t.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            yield from _flatten(v, key)
        else:
            yield key, v


def _seed_list(raw: Any, base: int, where: str) -> list[int]:
    if isinstance(raw, bool):
        raise SweepError(f"{where}: seeds must be a count or a list of seeds, got {raw!r}")
    if isinstance(raw, int):
        if raw < 1:
            raise SweepError(f"{where}: seeds must be >= 1, got {raw}")
        return [base + k for k in range(raw)]
    if (
        isinstance(raw, list)
        and raw
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in raw)
    ):
        if len(set(raw)) != len(raw):
            raise SweepError(f"{where}: seeds repeat: {raw}")
        return list(raw)
    raise SweepError(f"{where}: seeds must be a count or a list of seeds >= 0, got {raw!r}")


def make_plan(
    scenario: str | Path,
    sets: Sequence[tuple[str, list[Any]]] = (),
    seeds: int | Sequence[int] | None = None,
) -> Plan:
    """Read the scenario and its ``[sweep]`` table, apply ``sets`` and ``seeds`` over it
    (the command line wins over the file) and validate every setting.

    Raises SweepError naming every setting that does not give a valid scenario.
    """
    source = Path(scenario).resolve()
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as e:
        raise SweepError(f"{scenario}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        from sim.scenario import not_utf8

        raise SweepError(f"{scenario}: {not_utf8(e)}") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{scenario}: not valid TOML: {e}") from e
    values, file_seeds = _file_sweep(data, source)
    for key, vals in sets:
        values[key] = vals
    for key in values:
        key_path(key)  # reject malformed keys before anything runs
    base_seed = data.get("seed", 0) if isinstance(data.get("seed", 0), int) else 0
    raw_seeds = seeds if seeds is not None else file_seeds if file_seeds is not None else 1
    seed_list = _seed_list(
        list(raw_seeds) if isinstance(raw_seeds, list | tuple) else raw_seeds,
        base_seed,
        "--seeds" if seeds is not None else f"{scenario}: sweep.seeds",
    )
    keys = list(values)
    settings = [
        Setting(tuple(zip(keys, combo, strict=True))) for combo in product(*values.values())
    ]
    problems: list[str] = []
    name = ""
    inputs: dict[tuple[str, str], dict[str, str]] = {}
    for s in settings:
        try:
            sc = scenario_for(text, source, s)
            name = sc.name
            for i in input_digests(sc):
                i["file"] = _relative(Path(i["file"]), source.parent)
                inputs[i["key"], i["file"]] = i
        except ScenarioError as e:
            detail = "\n".join(f"    {p}" for p in e.problems)
            problems.append(f"  setting {s.label()}:\n{detail}")
        except SweepError as e:
            problems.append(f"  setting {s.label()}: {e}")
    if problems:
        raise SweepError(
            f"{scenario}: {len(problems)} setting(s) are not valid\n" + "\n".join(problems)
        )
    slugs = [s.slug() for s in settings]
    if len(set(slugs)) != len(slugs):
        raise SweepError("two settings are the same (a value is repeated)")
    return Plan(text, source, name, keys, values, seed_list, settings, list(inputs.values()))


def _relative(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder`` when it is inside it (so a sweep folder still checks
    its inputs after the scenario and its files move together), else as it is."""
    rel = os.path.relpath(path.resolve(), folder)
    return str(path) if rel.startswith("..") else rel


def check_inputs(root: str, old: Mapping[str, Any], plan: Plan) -> list[dict[str, str]]:
    """Refuse (SweepError) to add runs to a sweep folder whose runs read another version of
    a file the plan reads; return the inputs to record: the old manifest's and the plan's.

    A folder made before sweeps recorded inputs is refused when the scenario reads any file
    (nothing tells whether it changed); without input files its runs digest covers all.
    """
    if "inputs" not in old:
        if plan.inputs:
            files = ", ".join(i["file"] for i in plan.inputs)
            raise SweepError(
                f"{root} holds a sweep made before sweeps recorded the digests of their input "
                f"files: cannot tell whether {files} changed since its runs; use another "
                "--out folder"
            )
        return []
    recorded = {(i["key"], i["file"]): i for i in old["inputs"]}
    for i in plan.inputs:
        was = recorded.get((i["key"], i["file"]))
        if was is not None and was["sha256"] != i["sha256"]:
            raise SweepError(
                f"{i['file']} ({i['key']}) changed since the runs in {root} were made (its "
                "SHA-256 differs): new runs would mix inputs; restore the file or use "
                "another --out folder"
            )
        recorded[i["key"], i["file"]] = i
    return list(recorded.values())


# --------------------------------------------------------------------------- storage


def open_uri(uri: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a store URI and the path in it (without the scheme)."""
    from pyarrow import fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, str(path)


class Store:
    """The sweep's output folder: a local path or any URI pyarrow.fs opens (s3://, hdfs://,
    file://, ...). Runs are simulated into a local folder and copied when the store is not
    local."""

    def __init__(self, root: str) -> None:
        from pyarrow import fs as pafs

        if "://" in root and not root.startswith("file://"):
            self.fs, self.base = open_uri(root)
            self.local: Path | None = None
        else:
            local = Path(root[len("file://") :] if root.startswith("file://") else root)
            self.local = local.resolve()
            self.fs, self.base = pafs.LocalFileSystem(), str(self.local)
        self.root = root if self.local is None else str(self.local)

    def path(self, rel: str) -> str:
        """``rel`` in the store's filesystem (no scheme: for ``self.fs`` only)."""
        return f"{self.base.rstrip('/')}/{rel}"

    def uri(self, rel: str) -> str:
        """``rel`` as Spark and other readers open it: a local path, or the store's URI."""
        return self.path(rel) if self.local is not None else f"{self.root.rstrip('/')}/{rel}"

    def exists(self, rel: str) -> bool:
        from pyarrow import fs as pafs

        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def read_text(self, rel: str) -> str:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return bytes(f.read()).decode("utf-8")

    def write_text(self, rel: str, text: str) -> None:
        parent = self.path(rel).rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        with self.fs.open_output_stream(self.path(rel)) as f:
            f.write(text.encode("utf-8"))

    def clear(self, rel: str) -> None:
        """Remove what an interrupted run left behind."""
        from pyarrow import fs as pafs

        if self.fs.get_file_info(self.path(rel)).type == pafs.FileType.Directory:
            self.fs.delete_dir(self.path(rel))

    def upload(self, local: Path, rel: str) -> None:
        from pyarrow import fs as pafs

        self.fs.create_dir(self.path(rel), recursive=True)
        pafs.copy_files(str(local), self.path(rel), destination_filesystem=self.fs)


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Task:
    """Everything one worker needs (picklable: no open files, no Spark objects)."""

    text: str
    source: str
    root: str
    rel: str
    seed: int
    setting: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Outcome:
    """How one run went."""

    rel: str
    seed: int
    label: str
    ok: bool
    wall: float = 0.0
    published: int = 0
    deliveries: int = 0
    skipped: bool = False
    error: str = ""


def run_task(task: Task) -> Outcome:
    """Simulate one (setting, seed) and store its logs; never raises (errors are returned)."""
    from sim.runner import simulate

    setting = Setting(task.setting)
    label = setting.label()
    store = Store(task.root)
    try:
        scenario = scenario_for(task.text, Path(task.source), setting)
        store.clear(task.rel)
        if store.local is not None:
            out = store.local / task.rel
            result = simulate(scenario, out, seed=task.seed)
        else:
            with tempfile.TemporaryDirectory(prefix="dodwan-sweep-") as tmp:
                result = simulate(scenario, Path(tmp), seed=task.seed)
                _annotate(Path(tmp), setting, task)
                store.upload(Path(tmp), task.rel)
        if store.local is not None:
            _annotate(out, setting, task)
        store.write_text(f"{task.rel}/{MARKER}", "")
    except Exception as e:  # one failed run must not stop the others
        return Outcome(task.rel, task.seed, label, False, error=f"{type(e).__name__}: {e}")
    c = result.counters
    return Outcome(
        task.rel,
        task.seed,
        label,
        True,
        wall=result.wall_time,
        published=c.get("sim_published", 0) + c.get("sim_joms_published", 0),
        deliveries=c.get("sim_deliveries", 0),
    )


def _annotate(run_dir: Path, setting: Setting, task: Task) -> None:
    """Add the setting to the run's run.json (the analysis groups runs by it)."""
    path = run_dir / "run.json"
    info = json.loads(path.read_text())
    info["sweep"] = {"setting": setting.as_dict(), "label": setting.label(), "dir": task.rel}
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


Report = Callable[[Outcome, int, int], None]
"""Called after each run: (outcome, runs done so far, runs in the sweep)."""


def prepare(plan: Plan, root: str) -> tuple[Store, list[Task], list[Outcome]]:
    """Write the manifest; return the store, the runs still to do and the finished ones."""
    store = Store(root)
    from pyarrow import fs as pafs

    if store.fs.get_file_info(store.base).type == pafs.FileType.File:
        raise SweepError(f"{root} is a file, not a folder: give --out a folder")
    if store.exists(MANIFEST):
        try:
            old = json.loads(store.read_text(MANIFEST))
        except ValueError as e:
            raise SweepError(f"{root}/{MANIFEST} is not valid JSON: {e}") from e
        new = plan.manifest()
        same = old.get("scenario_sha256") == new["scenario_sha256"] or (
            old.get("runs_sha256") == new["runs_sha256"]
        )
        if not same:
            raise SweepError(
                f"{root} holds a sweep of another scenario file (or the file changed); "
                "use another --out folder"
            )
        plan = replace(plan, inputs=check_inputs(root, old, plan))
    store.write_text(MANIFEST, json.dumps(plan.manifest(), indent=2) + "\n")
    todo, done = [], []
    for r in plan.runs():
        if store.exists(f"{r.rel}/{MARKER}"):
            done.append(Outcome(r.rel, r.seed, r.setting.label(), True, skipped=True))
        else:
            todo.append(
                Task(plan.text, str(plan.source), store.root, r.rel, r.seed, r.setting.values)
            )
    return store, todo, done


def run_local(
    tasks: Sequence[Task], jobs: int, report: Report, done: int, total: int
) -> list[Outcome]:
    """Run the tasks in a pool of ``jobs`` processes (in this process when jobs == 1)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    outcomes = []
    if jobs <= 1:
        for t in tasks:
            o = run_task(t)
            outcomes.append(o)
            report(o, done + len(outcomes), total)
        return outcomes
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_task, t) for t in tasks]
        for f in as_completed(futures):
            o = f.result()
            outcomes.append(o)
            report(o, done + len(outcomes), total)
    return outcomes


def run_one_on_spark(sc: Any, task: Task) -> Outcome:
    """One run as a one-task Spark job (raises when Spark fails the job itself)."""
    out: list[Outcome] = sc.parallelize([task], 1).map(run_task).collect()
    return out[0]


def run_spark(
    tasks: Sequence[Task],
    master: str,
    jobs: int | None,
    report: Report,
    done: int,
    total: int,
) -> list[Outcome]:
    """Run each task as a one-task Spark job; ``jobs`` jobs are in flight at once (default:
    the cluster's default parallelism), so progress is reported run by run."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from sim.analysis.session import create_session

    spark = create_session(master, app_name="dodwan-sweep")
    sc = spark.sparkContext
    width = jobs or max(sc.defaultParallelism, 1)

    outcomes = []
    with ThreadPoolExecutor(max_workers=width) as pool:
        futures = {pool.submit(run_one_on_spark, sc, t): t for t in tasks}
        for f in as_completed(futures):
            try:
                o = f.result()
            except Exception as e:  # the Spark job itself failed (lost executor...)
                t = futures[f]
                label = Setting(t.setting).label()
                o = Outcome(t.rel, t.seed, label, False, error=f"Spark job failed: {e}")
            outcomes.append(o)
            report(o, done + len(outcomes), total)
    return outcomes


def run_sweep(
    plan: Plan,
    root: str,
    *,
    master: str | None = None,
    jobs: int | None = None,
    report: Report | None = None,
) -> list[Outcome]:
    """Run every (setting, seed) of ``plan`` not finished yet; return all outcomes."""
    import os

    _, todo, done = prepare(plan, root)
    total = len(done) + len(todo)
    rep: Report = report or (lambda o, k, n: None)
    if not todo:
        return done
    if master:
        return done + run_spark(todo, master, jobs, rep, len(done), total)
    width = jobs or os.cpu_count() or 1
    return done + run_local(todo, min(width, len(todo)), rep, len(done), total)
