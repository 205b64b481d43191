"""patterns.ProfileIndex (hosts' profiles for the unmet age, local subscriptions for
delivery): which profiles match a descriptor, found through the plain value each pattern
requires, is exactly what matching every profile finds, in the profiles' order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dodwan.core.patterns import Profile, ProfileIndex

NAMES = ["dest", "topic", "kind"]
VALUES = ["a", "b", "ab", "h1.r2"]
# plain strings (string equality) and expressions RE2 matches, some of them also plain
EXPRESSIONS = [*VALUES, "a|b", "a.*", "[ab]+", "h1\\.r2", ".*"]

patterns = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(EXPRESSIONS), min_size=1)
profiles = st.lists(patterns, max_size=3).map(
    lambda specs: Profile.from_patterns(specs) if specs else Profile()
)
descriptors = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES))


@settings(max_examples=300, deadline=None)
@given(st.lists(profiles, max_size=8), st.lists(descriptors, min_size=1, max_size=5))
def test_the_hosts_found_are_those_whose_profile_matches(
    held: list[Profile], descs: list[dict[str, str]]
) -> None:
    hosts = [(f"h{i}", prof) for i, prof in enumerate(held)]
    index = ProfileIndex(hosts)
    for d in descs:
        # each host once, in the order given (subscriptions are delivered in their order)
        assert index.matching(d) == [host for host, prof in hosts if prof.matches(d)]


def test_a_host_with_two_plain_patterns_both_satisfied_is_found_once() -> None:
    prof = Profile.from_patterns([{"dest": "a"}, {"topic": "b"}])
    index = ProfileIndex([("h", prof), ("g", Profile.from_patterns({"dest": "a.*"}))])
    assert index.matching({"dest": "a", "topic": "b"}) == ["h", "g"]
    assert index.matching({"dest": "b"}) == []
