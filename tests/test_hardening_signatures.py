"""Origin signatures through real daemons: keygen --signing, --signing-key, --trusted-key."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

from click.testing import CliRunner
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

from dodwan.cli import cli

FAST = ["--announce-period", "0.5"]


def _keygen(path: Path) -> str:
    r = CliRunner().invoke(cli, ["keygen", "--signing", str(path)])
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    public = r.output.strip()
    assert len(public) == 64 and bytes.fromhex(public)
    return public


def test_a_subscription_requiring_a_key_gets_only_what_that_key_signed(
    daemons, tmp_path: Path
) -> None:
    k1, k2 = tmp_path / "k1", tmp_path / "k2"
    pub1, pub2 = _keygen(k1), _keygen(k2)
    assert pub1 != pub2
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", "--signing-key", str(k1), *FAST)
    b = daemons("b", "--group", group, "--host-id", "b", "--signing-key", str(k2), *FAST)
    s = daemons("s", "--group", group, "--host-id", "s", *FAST)
    trusted, everything = tmp_path / "trusted", tmp_path / "all"
    r = CliRunner().invoke(
        cli,
        ["subscribe", "--state-dir", str(s.state_dir), "-p", "topic=sig\\..*",
         "--dir", str(trusted), "--trusted-key", pub1, "--key", "only-k1"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    s.client().post(
        "/subscribe",
        {"patterns": [{"topic": "sig\\..*"}], "sink": {"kind": "dir", "target": str(everything)}},
    )
    wait_for(lambda: set(a.status()["neighbours"]) == {"b", "s"}, what="a hears b and s")
    ids = {
        name: proc.client().post(
            "/publish", {"attributes": {"topic": f"sig.{name}"}, "text": name, "ttl": 600}
        )["id"]
        for name, proc in (("a", a), ("b", b), ("s", s))
    }
    wait_for(
        lambda: all((everything / f"{i}.json").exists() for i in ids.values()),
        what="every message reaches the unrestricted subscription",
    )
    wait_for(lambda: (trusted / f"{ids['a']}.json").exists(), what="signed delivery")
    start = s.status()["counters"]["announcements_sent"]
    wait_for(lambda: s.status()["counters"]["announcements_sent"] >= start + 2, what="rounds")
    assert sorted(p.name for p in trusted.iterdir()) == sorted([ids["a"], f"{ids['a']}.json"])
    shown = {i: s.client().get(f"/cache/{i}") for i in ids.values()}
    assert shown[ids["a"]]["signed_by"] == pub1
    assert shown[ids["b"]]["signed_by"] == pub2
    assert shown[ids["s"]]["signed_by"] is None
    r = CliRunner().invoke(cli, ["cache", "show", "--state-dir", str(s.state_dir), ids["a"]])
    assert r.exit_code == 0 and f"signed by  {pub1}" in r.output
    assert s.status()["counters"].get("dropped_bad_signature", 0) == 0

    # The requirement is part of the durable subscription.
    s.kill(signal.SIGKILL)
    s.start()
    subs = {x["key"]: x for x in s.client().get("/subscriptions")}
    assert subs["only-k1"]["trusted_keys"] == [pub1]


def test_bad_trusted_keys_and_signing_keys_are_clear_errors(daemons, tmp_path: Path) -> None:
    s = daemons("s", "--group", random_group(), *FAST)
    r = CliRunner().invoke(
        cli,
        ["subscribe", "--state-dir", str(s.state_dir), "-p", "t=x",
         "--dir", str(tmp_path / "o"), "--trusted-key", "not-hex"],
    )  # fmt: skip
    assert r.exit_code != 0 and r.output.startswith("Error: ") and "Traceback" not in r.output
    assert s.client().get("/subscriptions") == []
    bad = tmp_path / "bad.key"
    bad.write_text("nope\n")
    r = CliRunner().invoke(
        cli, ["daemon", "--state-dir", str(tmp_path / "x"), "--signing-key", str(bad)]
    )
    assert r.exit_code != 0 and r.output.startswith("Error: --signing-key")
