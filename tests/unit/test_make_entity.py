"""`make`: a response entity of any version from the same keyword arguments."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.metadata.v1.response import MetadataResponse as MetadataResponseV1
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12

from tierbroker.broker.handlers.common import make

FIELDS = {
    "throttle_time": datetime.timedelta(0),
    "brokers": (),
    "cluster_id": "c",
    "controller_id": 0,
    "topics": (),
}


def test_a_version_keeps_the_fields_it_has_and_drops_those_of_other_versions() -> None:
    newest = make(MetadataResponseV12, **FIELDS, cluster_authorized_operations=-2147483648)
    assert newest.cluster_id == "c"
    older = make(MetadataResponseV1, **FIELDS)
    assert older == MetadataResponseV1(brokers=(), controller_id=0, topics=())


def test_a_name_no_version_has_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="MetadataResponse has no field clutser_id in any version"):
        make(MetadataResponseV1, brokers=(), controller_id=0, topics=(), clutser_id="c")
