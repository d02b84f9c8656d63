"""The node's RBAC audit reads requests as the API server's authorizer does and refuses what no bound rule
allows (tests/cluster/rbac_audit.py)."""

from __future__ import annotations

import pytest
from cluster.rbac_audit import Attributes, attributes, refused
from helpers.emulator import Api, emulated_api_server

RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", Attributes("list", "", "pods", "ns", None)),
        ("GET", "/api/v1/pods?watch=true&resourceVersion=5", Attributes("watch", "", "pods", None, None)),
        ("GET", "/api/v1/nodes/n1", Attributes("get", "", "nodes", None, "n1")),
        (
            "PATCH",
            "/apis/kuberl.io/v1alpha1/namespaces/ns/rljobs/j/status",
            Attributes("patch", "kuberl.io", "rljobs/status", "ns", "j"),
        ),
        ("POST", "/apis/apps/v1/namespaces/ns/statefulsets", Attributes("create", "apps", "statefulsets", "ns", None)),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", Attributes("delete", "", "pods", "ns", "p")),
        ("GET", "/apis", None),
        ("GET", "/version", None),
    ],
)
def test_requests_read_as_the_authorizer_reads_them(method, url, expected):
    assert attributes(method, url) == expected


def test_a_request_no_bound_rule_allows_is_refused():
    with emulated_api_server() as url:
        api = Api(url)
        role = {
            "metadata": {"name": "reader", "namespace": "ns"},
            "rules": [{"apiGroups": ["kuberl.io"], "resources": ["rljobs"], "resourceNames": ["j"], "verbs": ["get"]}],
        }
        api.post(f"{RBAC}/namespaces/ns/roles", role)
        binding = {
            "metadata": {"name": "reader", "namespace": "ns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "learner", "namespace": "ns"}],
        }
        api.post(f"{RBAC}/namespaces/ns/rolebindings", binding)
        requests = [
            ("10.0.0.2", "GET", "/apis/kuberl.io/v1alpha1/namespaces/ns/rljobs/j"),  # allowed
            ("10.0.0.2", "GET", "/apis/kuberl.io/v1alpha1/namespaces/ns/rljobs/other"),  # another name
            ("10.0.0.2", "PATCH", "/apis/kuberl.io/v1alpha1/namespaces/ns/rljobs/j/status"),  # a subresource
            ("10.0.0.3", "GET", "/apis/kuberl.io/v1alpha1/namespaces/ns/rljobs/j"),  # another account
            ("10.0.0.2", "GET", "/apis"),  # discovery: always allowed
        ]
        accounts = {"10.0.0.2": ("ns", "learner"), "10.0.0.3": ("ns", "default")}
        assert refused(api, requests, accounts) == [
            "ns:default get kuberl.io/rljobs ns/j",
            "ns:learner get kuberl.io/rljobs ns/other",
            "ns:learner patch kuberl.io/rljobs/status ns/j",
        ]
