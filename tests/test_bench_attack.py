"""bench/attack.py, briefly: every attack of the hostile-neighbour issue at once against a
real victim daemon, printed side by side with an unattacked run (see the bench's docstring).

Asserts what the bench must show to be worth reading: both columns parse, legitimate
messages got through in both runs, the attack really was sent (every kind of it) and was
seen by the victim, and the victim survived without a traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("regex", "huge_offers", "padded", "crowd", "ranges", "junk", "eternal", "zeros")


def _row(out: str, label: str) -> list[str]:
    m = re.search(rf"^{re.escape(label)}\s+(\S+)\s+(\S+)$", out, re.M)
    assert m, f"no row {label!r} in:\n{out}"
    return [m.group(1), m.group(2)]


def test_attack_bench_prints_both_columns_and_legit_traffic_gets_through(
    tmp_path: Path,
) -> None:
    report = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "bench" / "attack.py"), "--duration", "10",
           "--rate", "200000", "--settle", "5", "--json", str(report)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    assert "Traceback" not in done.stderr, done.stderr
    header = out.splitlines()[1].split()
    assert header == ["baseline", "attack"]
    for label in ("victim RSS peak (MB)", "victim VmHWM (MB)", "admin /status p99 (ms)",
                  "legit latency median (s)", "legit latency p99 (s)"):  # fmt: skip
        base, attack = (float(x) for x in _row(out, label))
        assert base > 0 and attack > 0, label
    for cell in _row(out, "legit delivered/published"):
        delivered, published = (int(x) for x in cell.split("/"))
        assert published >= 8 and 0 < delivered <= published, cell
    assert _row(out, "victim alive, tracebacks") == ["yes,0", "yes,0"]
    assert _row(out, "victim kept own + delivered") == ["yes", "yes"]
    sent = {k: int(x) for k, x in re.findall(rf"^({'|'.join(KINDS)})\s+(\d+)\s", out, re.M)}
    assert set(sent) == set(KINDS) and all(sent.values()), sent
    base, attack = (float(x) for x in _row(out, "attack MB sent"))
    assert base == 0 and attack >= 1.0  # 10 s x 200 kB/s, give or take the last burst
    # the victim saw the attack: refusals counted in the attack column only
    for counter in ("dropped_bad_pattern", "dropped_ttl_too_long"):
        base_n, attack_n = (int(x) for x in _row(out, f"counter {counter}"))
        assert base_n == 0 < attack_n, counter
    assert report.exists() and '"attack": true' in report.read_text()
