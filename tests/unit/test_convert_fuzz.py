"""No traceback from the converter on any input: arbitrary text, and CronJob-shaped objects
whose fields hold the wrong types, get one-line errors naming the source, never an
exception; whatever converts loads as a ScheduledJob."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwell import convert
from cronwell.models import ScheduledJob

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.text(max_size=12), st.floats(0, 10)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
POD = {"restartPolicy": "Never", "containers": [{"name": "m", "image": "busybox"}]}


def field(good: Any) -> st.SearchStrategy[Any]:
    """The right value most of the time, anything else otherwise."""
    return st.one_of(st.just(good), values)


cronjobs = st.fixed_dictionaries(
    {
        "apiVersion": field("batch/v1"),
        "kind": field("CronJob"),
        "metadata": field({"name": "c"})
        | st.fixed_dictionaries(
            {"name": field("c"), "labels": field({"a": "b"}), "annotations": field({"x": "y"})}
        ),
        "spec": field({})
        | st.fixed_dictionaries(
            {
                "schedule": field("@daily"),
                "timeZone": field("Europe/Paris"),
                "concurrencyPolicy": field("Forbid"),
                "startingDeadlineSeconds": field(10),
                "suspend": field(False),
                "successfulJobsHistoryLimit": field(3),
                "jobTemplate": field({"spec": {"template": {"spec": POD}}})
                | st.fixed_dictionaries(
                    {
                        "metadata": field({"labels": {"a": "b"}}),
                        "spec": field({"template": {"spec": POD}})
                        | st.fixed_dictionaries(
                            {"template": field({"spec": POD}), "activeDeadlineSeconds": field(60)}
                        ),
                    }
                ),
            }
        ),
    }
)


def check(text: str) -> None:
    done, errors = convert.convert_stream(text, "in.yaml")
    for e in errors:
        message = str(e)
        assert "\n" not in message and message.startswith("in.yaml"), message
    for c in done:
        ScheduledJob.model_validate(c.document)
        assert all("\n" not in w for w in c.warnings)
    if done:
        assert len(list(yaml.safe_load_all(convert.dump(done)))) == len(done)


@FUZZ
@given(cronjobs)
def test_cronjob_shaped_objects(doc: dict[str, Any]) -> None:
    check(yaml.safe_dump(doc))


@FUZZ
@given(st.lists(cronjobs | values, max_size=3) | values)
def test_lists_of_them(items: Any) -> None:
    check(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    check(text)
