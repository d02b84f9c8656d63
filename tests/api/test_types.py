"""Durations, quantities and storage URIs: the scalar types the spec is built from."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from kuberl.api.types import Duration, Quantity, StorageUri, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("36h", 129600), ("1h30m", 5400), ("7d", 604800), ("1.5h", 5400), ("250ms", 0.25)],
)
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "36", "h", "1 h", "-5m", "1w", "forever", "1h 30m"])
def test_bad_durations_name_the_expected_form(text):
    with pytest.raises(ValueError, match="expected a duration such as '90s'"):
        parse_duration(text)


def test_zero_duration_is_rejected():
    with pytest.raises(ValidationError, match="longer than zero"):
        TypeAdapter(Duration).validate_python("0s")


@pytest.mark.parametrize("value", [1, 0, "500m", "16Gi", "1.5", "2e3", "100M"])
def test_quantities(value):
    assert TypeAdapter(Quantity).validate_python(value) == value


@pytest.mark.parametrize(
    ("value", "words"), [(0.5, "as strings"), (True, "quantity"), ("12XB", "quantity"), (-1, "negative")]
)
def test_bad_quantities(value, words):
    with pytest.raises(ValidationError, match=words):
        TypeAdapter(Quantity).validate_python(value)


@pytest.mark.parametrize(
    "uri", ["s3://bucket/prefix", "s3://my.bucket", "file:///models/x", "runs/models/tiny", "/abs/path"]
)
def test_storage_uris(uri):
    assert TypeAdapter(StorageUri).validate_python(uri) == uri


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("gs://bucket/x", "unsupported URI scheme 'gs://'"),
        ("s3://", "valid bucket name"),
        ("s3://A_B/x", "valid bucket"),
        ("file://", "no path"),
        ("  ", "expected an s3://"),
    ],
)
def test_bad_storage_uris(uri, words):
    with pytest.raises(ValidationError, match=words):
        TypeAdapter(StorageUri).validate_python(uri)
