"""deploy/kubernetes, checked without a cluster (none can run here): what each check covers
is what docs/deploy.md#kubernetes claims, and no more.

- ``kubectl apply --dry-run=client -k deploy/kubernetes``: kustomize builds the set
  (namespace, image), kubectl decodes every object and maps its kind to a resource.
  Client dry-run still asks a server which resources exist and whether each object
  does: the server here answers the API's discovery for the kinds the manifests use
  and "not found" for every object (:class:`_Discovery`), as an empty cluster would.
  kubectl's own schema validation needs the server's OpenAPI document and is off.
- ``kubernetes-validate --strict``: every rendered object against the JSON schemas of
  Kubernetes 1.29 and 1.37 that the package carries, rejecting unknown fields.
  ``make test-kubernetes`` installs it into ``.venv-k8s`` (PyPI) and requires it;
  elsewhere this part is skipped in one line when the tool is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
VALIDATOR = ROOT / ".venv-k8s" / "bin" / "kubernetes-validate"
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
#: The kinds of the manifests, by API group version, as discovery lists them.
RESOURCES = {
    "v1": [("services", "Service"), ("namespaces", "Namespace"), ("secrets", "Secret")],
    "apps/v1": [("statefulsets", "StatefulSet"), ("daemonsets", "DaemonSet")],
    "batch/v1": [("jobs", "Job")],
}
OBJECTS = {
    ("Service", "hetero-coord"),
    ("StatefulSet", "hetero-coord"),
    ("DaemonSet", "hetero-agent"),
    ("Service", "hetero-train"),
    ("Job", "hetero-train"),
}


class _Discovery(BaseHTTPRequestHandler):
    """The API's legacy discovery documents; 404 (an empty cluster) for anything else."""

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        body = _discovery(path)
        if body is None:
            status, body = (
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                    "message": f"{path} not found",
                },
            )
        else:
            status = 200
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _discovery(path: str) -> dict[str, Any] | None:
    if path == "/version":
        return {"major": "1", "minor": "32", "gitVersion": "v1.32.0"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups = [gv.split("/")[0] for gv in RESOURCES if "/" in gv]
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
                }
                for g in groups
            ],
        }
    group_version = path.removeprefix("/api/").removeprefix("/apis/")
    if path in ("/api/v1", f"/apis/{group_version}") and group_version in RESOURCES:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": name,
                    "singularName": kind.lower(),
                    "kind": kind,
                    "namespaced": kind != "Namespace",
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
                for name, kind in RESOURCES[group_version]
            ],
        }
    return None


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "stub",
                        "cluster": {"server": f"http://127.0.0.1:{server.server_port}"},
                    }
                ],
                "users": [{"name": "stub", "user": {}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
                "current-context": "stub",
            }
        )
    )
    try:
        yield config
    finally:
        server.shutdown()
        server.server_close()


def _kubectl(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    env = {
        **os.environ,
        "HOME": str(kubeconfig.parent) if kubeconfig else os.environ.get("HOME", "/"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([kubectl, *args], env=env, capture_output=True, text=True, timeout=60)


def test_manifests_apply_in_client_dry_run(kubeconfig: Path) -> None:
    done = _kubectl(
        "apply",
        "--dry-run=client",
        "--validate=false",
        "-k",
        str(MANIFESTS),
        "-o",
        "json",
        kubeconfig=kubeconfig,
    )
    assert done.returncode == 0, done.stderr
    applied = json.loads(done.stdout)["items"]
    assert {(o["kind"], o["metadata"]["name"]) for o in applied} == OBJECTS
    assert {o["metadata"]["namespace"] for o in applied} == {"hetero"}


def test_rendered_manifests_match_the_apis_schemas(tmp_path: Path) -> None:
    validator = shutil.which("kubernetes-validate") or (
        str(VALIDATOR) if VALIDATOR.exists() else None
    )
    if validator is None:
        if os.environ.get("HETERO_K8S_VALIDATE") == "1":
            pytest.fail(
                f"kubernetes-validate not found ({VALIDATOR}: make test-kubernetes installs it)"
            )
        pytest.skip("kubernetes-validate not installed (make test-kubernetes installs it)")
    rendered = _kubectl("kustomize", str(MANIFESTS))
    assert rendered.returncode == 0, rendered.stderr
    (tmp_path / "rendered.yaml").write_text(rendered.stdout)
    for version in KUBERNETES_VERSIONS:
        done = subprocess.run(
            [validator, "--strict", "--quiet", "-k", version, str(tmp_path / "rendered.yaml")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"Kubernetes {version}: {done.stdout}{done.stderr}"


def test_training_job_rendezvous_is_pod_zero_of_its_headless_service() -> None:
    rendered = _kubectl("kustomize", str(MANIFESTS))
    assert rendered.returncode == 0, rendered.stderr
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(rendered.stdout)}
    service, job = objects["Service", "hetero-train"], objects["Job", "hetero-train"]
    assert service["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    command = pod["containers"][0]["command"]
    assert f"--nnodes={spec['completions']}" in command
    assert f"--master-addr={job['metadata']['name']}-0.{pod['subdomain']}" in command
