"""Which Kueue API version nodeagent speaks, and how it reads Kueue objects."""

from __future__ import annotations

import pytest

from nodeagent_tiering.cluster import kueue


@pytest.mark.parametrize(
    ("served", "preferred", "speaks"),
    [
        pytest.param(["v1beta1", "v1beta2"], "v1beta2", "v1beta2", id="v0.15 and later"),
        pytest.param(["v1beta1"], "v1beta1", "v1beta1", id="before v0.15: v1beta1 only"),
        pytest.param(["v1beta1", "v1beta2"], "v1beta1", "v1beta1", id="preferred wins if known"),
        pytest.param(["v1beta2", "v1"], "v1", "v1beta2", id="an unknown preferred version"),
        pytest.param(["v1alpha1"], "v1alpha1", None, id="only versions nodeagent does not know"),
        pytest.param([], None, None, id="no Kueue"),
    ],
)
def test_the_served_version_nodeagent_speaks(served, preferred, speaks):
    assert kueue.served_version(served, preferred) == speaks


def test_v1beta1_names_the_cohort_field_and_cohort_objects_may_be_missing():
    old = kueue.KueueApi("v1beta1", frozenset({"clusterqueues", "resourceflavors"}))
    assert old.cohort_field == "cohort"
    assert not old.serves(kueue.COHORT)
    assert kueue.KueueApi("v1beta2").cohort_field == "cohortName"
    assert kueue.cohort_of({"spec": {"cohort": "a"}}) == kueue.cohort_of(
        {"spec": {"cohortName": "a"}}
    )
