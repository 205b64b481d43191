"""How the suite may be spread over pytest-xdist workers (``make test`` runs three).

Most tests wait on real I/O (daemons exchanging datagrams, brokers, subprocesses), so
several workers overlap those waits. Every test already picks its own multicast group,
ports and temporary directories; what must not be split across workers is state set up
once and shared by several tests:

* a module- or session-scoped fixture defined (or imported) by a test module — a pair of
  daemons, a simulated run, a broker: the tests requesting it go to one worker as one group
  named after the fixture, so it is set up once, as in a serial run (grouped here, from
  each test's fixture closure);
* a shared fixture requested through ``request.getfixturevalue`` (a broker chosen by a
  parameter) is not in that closure: such tests carry an ``xdist_group`` mark themselves
  (test_bridges.py, test_stomp_differential.py);
* the suite's one SparkSession (``spark_fixtures.shared_spark``), used by several modules:
  their tests are marked ``SPARK_GROUP`` so one worker starts one JVM.

With ``--dist loadgroup`` xdist keeps each group on one worker and hands out the other tests
one by one. Run without ``-n``, the marks change nothing.
"""

from __future__ import annotations

import pytest


def _shared_fixture(item: pytest.Item) -> str | None:
    """The name of a module/session-scoped fixture defined by the tests that this test
    requests (the first by name), or None. Builtin ones (``tmp_path_factory``) do not count.
    Two modules' fixtures of one name share a group: coarser, never unsafe."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # pytest's internals changed: keep the module together, always safe
        return item.nodeid.split("::", 1)[0]
    names = sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope != "function" and defs[-1].baseid
    )
    return names[0] if names else None


@pytest.hookimpl(tryfirst=True)  # before xdist turns the marks into groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = _shared_fixture(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
