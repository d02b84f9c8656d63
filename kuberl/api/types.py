"""Constrained scalar types shared by the API models: durations, quantities and URIs.

Each type validates in Python (pydantic) and carries the same constraint into the CRD schema
(pattern or CEL rule), so `kubectl apply` and `kuberl validate` reject the same values.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

# Go-style durations ("90s", "30m", "36h", "1h30m") plus days ("7d"), which long RL jobs want.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration string such as '36h' or '1h30m'; ValueError names the expected form."""
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"expected a duration such as '90s', '30m', '36h', '1h30m' or '7d', got {text!r}")
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))


def _check_duration(text: str) -> str:
    if parse_duration(text) <= 0:
        raise ValueError(f"duration must be longer than zero, got {text!r}")
    return text


Duration = Annotated[
    str,
    AfterValidator(_check_duration),
    Field(max_length=32, json_schema_extra={"pattern": DURATION_PATTERN}),
]

# The pattern Kubernetes itself publishes for resource.Quantity.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


_QUANTITY_SUFFIX: dict[str, float] = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000**i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E")) if s},
    "m": 1e-3,
    "n": 1e-9,
    "u": 1e-6,
}


def quantity_value(quantity: int | str) -> float:
    """A Kubernetes quantity (64Gi, 500M, 1e9, 500m, 3) as a number; ValueError for anything else."""
    text = str(quantity)
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", text)
    if not match or match.group(2) not in _QUANTITY_SUFFIX:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    return float(match.group(1)) * _QUANTITY_SUFFIX[match.group(2)]


def _check_quantity(value: object) -> int | str:
    # Runs before the int|str union so that floats and booleans get one clear message.
    if isinstance(value, float):
        raise ValueError(f"write fractional quantities as strings, such as '0.5' or '500m', got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a Kubernetes quantity such as 2, '500m' or '16Gi', got {value!r}")
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"expected a Kubernetes quantity such as 2, '500m' or '16Gi', got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"quantity must not be negative, got {value}")
    return value


Quantity = Annotated[
    int | str,
    BeforeValidator(_check_quantity),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]

URI_SCHEMES = ("s3", "file")
URI_CEL = "!self.contains('://') || self.startsWith('s3://') || self.startsWith('file://')"
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")


def _check_uri(text: str) -> str:
    if not text.strip():
        raise ValueError("expected an s3://bucket/prefix URI, a file:// URI or a local path, got ''")
    if "://" not in text:
        return text  # a local path
    scheme = text.split("://", 1)[0]
    if scheme not in URI_SCHEMES:
        raise ValueError(
            f"unsupported URI scheme {scheme + '://'!r} in {text!r}: use s3://bucket/prefix, "
            "file:///absolute/path or a local path"
        )
    if scheme == "s3" and not _S3_URI.match(text):
        raise ValueError(f"expected s3://<bucket>/<prefix> with a valid bucket name, got {text!r}")
    if scheme == "file" and len(text) <= len("file://"):
        raise ValueError(f"file:// URI has no path: {text!r}")
    return text


StorageUri = Annotated[
    str,
    AfterValidator(_check_uri),
    Field(
        min_length=1,
        max_length=2048,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": URI_CEL, "message": "must be an s3:// or file:// URI or a local path"}
            ]
        },
    ),
]

# DNS-1123 label: names of Kubernetes objects derived from the job and of label values.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]

# DNS-1123 subdomain: names of Secrets and most other Kubernetes objects (pull secrets, for one).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _check_dns_subdomain(text: str) -> str:
    if len(text) > 253:
        raise ValueError(f"must be at most 253 characters (a DNS subdomain), got {len(text)}")
    if not re.fullmatch(DNS_SUBDOMAIN_PATTERN, text):
        raise ValueError(
            "must be a Kubernetes object name (a DNS subdomain): lowercase letters, digits, '-' and '.', "
            f"starting and ending with a letter or digit, got {text!r}"
        )
    return text


DnsSubdomain = Annotated[
    str,
    AfterValidator(_check_dns_subdomain),
    Field(json_schema_extra={"minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN_PATTERN}),
]

# Container image reference; kept loose (registries differ) but bounded and without spaces.
IMAGE_PATTERN = r"^[^\s]+$"
Image = Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_PATTERN)]
