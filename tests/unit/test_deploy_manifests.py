"""deploy/: the Kubernetes manifests, the image and the compose stack, checked without a cluster.

Every manifest is validated against the Kubernetes OpenAPI models (kubernetes-asyncio's), then
against what the platform needs: hardened, resourced pods; probes on the HTTP role; RBAC that grants
exactly what the launcher and the watches use; disruption budgets that select real pods; and the
trust boundary (docs/security.md): the platform's credentials come from Secrets, the API serves
tenants from a Secret and is out of the learners' reach, learner pods start from "no traffic".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.kube import openapi_problems

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "kubernetes"

#: (API group, resource) -> the verbs the Kubernetes launcher, pod watcher and node inventory use.
USED_VERBS = {
    ("", "pods"): {"create", "get", "list", "watch", "delete"},
    ("", "services"): {"create", "get", "list", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"create", "get", "delete"},
    ("", "secrets"): {"create", "get", "delete"},
    ("", "nodes"): {"get", "list", "watch"},
}
#: Secret -> the keys the platform's pods read from it.
PLATFORM_SECRETS = {"ffdl-platform": {"password"}, "ffdl-etcd": {"username", "password"}}


def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return loaded


def documents() -> list[dict[str, Any]]:
    return [
        doc
        for name in kustomization()["resources"]
        for doc in yaml.safe_load_all((BASE / name).read_text())
        if doc
    ]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents() if doc["kind"] == kind]


def test_the_kustomization_lists_every_manifest_file() -> None:
    files = {path.name for path in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization()["resources"]) == sorted(files)


def test_every_manifest_is_valid_against_the_kubernetes_openapi_models() -> None:
    docs = documents()
    assert len(docs) >= 15
    assert {doc["kind"]: openapi_problems(doc) for doc in docs if openapi_problems(doc)} == {}


def test_every_namespaced_object_names_its_namespace_and_namespaces_enforce_restricted_pods() -> None:
    cluster_wide = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    assert all(doc["metadata"].get("namespace") for doc in documents() if doc["kind"] not in cluster_wide)
    for namespace in of_kind("Namespace"):
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_deployments_run_every_role_hardened_and_with_resources() -> None:
    roles: set[str] = set()
    for deployment in of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["command"][:3] == ["ffdl", "up", "--roles"]
            roles.update(container["command"][3].split(","))
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert "memory" in container["resources"]["limits"]
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )
    assert roles == {"api", "workers", "scheduler", "projector"}


def test_the_http_role_is_probed_on_healthz_and_readyz() -> None:
    serving = [
        d
        for d in of_kind("Deployment")
        if any(c.get("ports") for c in d["spec"]["template"]["spec"]["containers"])
    ]
    assert [d["metadata"]["name"] for d in serving] == ["ffdl-api"]
    (container,) = serving[0]["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (service,) = of_kind("Service")
    assert service["spec"]["selector"].items() <= serving[0]["spec"]["template"]["metadata"]["labels"].items()


def test_only_the_roles_that_call_the_kubernetes_api_get_a_token() -> None:
    tokens = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["automountServiceAccountToken"]
        for d in of_kind("Deployment")
    }
    assert tokens == {"ffdl-api": False, "ffdl-workers": True, "ffdl-scheduler": True}


def test_rbac_grants_exactly_the_verbs_the_launcher_and_the_watches_use() -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for role in [*of_kind("Role"), *of_kind("ClusterRole")]:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == USED_VERBS
    (role,) = of_kind("Role")
    assert role["metadata"]["namespace"] == "ffdl-jobs"  # learner pods only, not the platform's namespace
    (cluster_role,) = of_kind("ClusterRole")
    assert [rule["resources"] for rule in cluster_role["rules"]] == [["nodes"]]
    bound = {
        (b["roleRef"]["name"], s["name"])
        for b in [*of_kind("RoleBinding"), *of_kind("ClusterRoleBinding")]
        for s in b["subjects"]
    }
    assert bound == {
        ("ffdl-launcher", "ffdl-workers"),
        ("ffdl-node-reader", "ffdl-workers"),
        ("ffdl-node-reader", "ffdl-scheduler"),
    }


def test_every_disruption_budget_selects_the_pods_of_a_deployment() -> None:
    templates = [d["spec"]["template"]["metadata"]["labels"] for d in of_kind("Deployment")]
    budgets = of_kind("PodDisruptionBudget")
    assert len(budgets) == len(templates)
    for budget in budgets:
        selector = budget["spec"]["selector"]["matchLabels"]
        assert sum(selector.items() <= labels.items() for labels in templates) == 1


def test_the_platform_configuration_chooses_pods_kafka_and_etcd() -> None:
    (config,) = of_kind("ConfigMap")
    data = config["data"]
    assert data["FFDL_LAUNCHER"] == "kubernetes"
    assert data["FFDL_BUS"].startswith("kafka://")
    assert data["FFDL_HEARTBEATS"].startswith("etcd://")
    assert data["FFDL_KUBE__NAMESPACE"] == "ffdl-jobs"


def test_kafka_authenticates_the_platform_and_no_password_is_in_the_configuration() -> None:
    (config,) = of_kind("ConfigMap")
    data = config["data"]
    assert data["FFDL_KAFKA__SECURITY_PROTOCOL"].startswith("SASL")
    assert data["FFDL_KAFKA__SASL_MECHANISM"].startswith("SCRAM")
    assert not [name for name in data if "PASSWORD" in name or "TOKEN" in name]


def secret_refs(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The container's variables that come from Secrets: name -> (secret, key)."""
    return {
        item["name"]: (ref["name"], ref["key"])
        for item in container.get("env", [])
        if (ref := item.get("valueFrom", {}).get("secretKeyRef"))
    }


def test_every_role_logs_in_to_kafka_and_etcd_with_the_platforms_secrets() -> None:
    for deployment in of_kind("Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert secret_refs(container) == {
            "FFDL_KAFKA__SASL_PASSWORD": ("ffdl-platform", "password"),
            "FFDL_ETCD__USERNAME": ("ffdl-etcd", "username"),
            "FFDL_ETCD__PASSWORD": ("ffdl-etcd", "password"),
        }, deployment["metadata"]["name"]
        assert all(key in PLATFORM_SECRETS[name] for name, key in secret_refs(container).values())


def test_the_api_serves_the_tenants_of_a_secret_and_is_never_started_open() -> None:
    """The API authenticates with the Secret's tenants, and the workers (the job owners) read the same
    file for the tenants' priority ceilings, so a submission the API lets through the owner decides."""
    (config,) = of_kind("ConfigMap")
    tenants_file = Path(config["data"]["FFDL_TENANTS_FILE"])
    for name in ("ffdl-api", "ffdl-workers"):
        (deployment,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == name]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(tenants_file.parent)]
        assert mount["readOnly"] is True
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "ffdl-tenants"
    for deployment in of_kind("Deployment"):
        assert "--open" not in deployment["spec"]["template"]["spec"]["containers"][0]["command"]


def policies(namespace: str) -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc["spec"]
        for doc in of_kind("NetworkPolicy")
        if doc["metadata"]["namespace"] == namespace
    }


def test_learner_pods_start_from_no_traffic_in_or_out() -> None:
    """Each job's own policy (made by the launcher) adds its peers, DNS and the heartbeat store."""
    assert policies("ffdl-jobs") == {
        "default-deny": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    }


def test_the_api_is_reachable_from_every_namespace_but_the_learners() -> None:
    platform = policies("ffdl")
    assert platform["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    api = platform["ffdl-api"]
    (api_deployment,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "ffdl-api"]
    assert (
        api["podSelector"]["matchLabels"].items()
        <= api_deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (rule,) = api["ingress"]
    assert rule["from"] == [
        {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["ffdl-jobs"]}
                ]
            }
        }
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]


def test_etcd_takes_clients_from_the_platform_and_learners_only_on_its_client_port() -> None:
    etcd = policies("ffdl")["etcd"]
    clients, peers = etcd["ingress"]
    namespaces = {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in clients["from"]
    }
    assert namespaces == {"ffdl", "ffdl-jobs"}
    assert clients["ports"] == [{"protocol": "TCP", "port": 2379}]
    assert peers["from"] == [{"podSelector": etcd["podSelector"]}]
    assert peers["ports"] == [{"protocol": "TCP", "port": 2380}]


def test_the_image_is_multi_stage_unprivileged_and_starts_under_tini() -> None:
    lines = [
        line.strip()
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert sum(line.startswith("FROM ") for line in lines) >= 2
    (user,) = [line for line in lines if line.startswith("USER ")]
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["tini", "-g", "--"]' in lines
    assert any("apt-get install" in line and "tini" in line for line in lines)


def test_the_image_runs_the_compiled_planner_and_carries_no_compiler() -> None:
    """The build stage compiles the planner (``ffdl.native``) from the source tree and fails unless
    the installed package then runs it; the compiler and mypy stay in that stage."""
    build, run = (DEPLOY / "Dockerfile").read_text().split(" AS run\n")
    steps = " ".join(build.replace("\\\n", " ").split())
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in steps
    assert "native.build()" in steps and "cp -r src/ffdl/compiled" in steps
    assert "assert native.active()" in steps.split("native.build()")[1]
    assert "gcc" not in run and "mypy" not in run
    assert "COPY --from=build /opt/ffdl /opt/ffdl" in run


def test_the_compose_stack_runs_the_platform_on_kafka_and_mosquitto_with_learners_shut_out() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"kafka", "mosquitto", "ffdl"}
    platform = services["ffdl"]
    environment = platform["environment"]
    assert environment["FFDL_BUS"] == "kafka://kafka:9092"
    assert environment["FFDL_MQTT"] == "mqtt://mosquitto:1883"
    assert set(platform["depends_on"]) == {"kafka", "mosquitto"}
    # learners share the container's network: Kafka authenticates, the heartbeats are embedded
    assert environment["FFDL_KAFKA__SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    assert "FFDL_HEARTBEATS" not in environment
    kafka = services["kafka"]["environment"]
    protocols = dict(entry.split(":") for entry in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    reachable = [
        listener.split("://")[0]
        for listener in kafka["KAFKA_LISTENERS"].split(",")
        if "://localhost:" not in listener
    ]
    assert [protocols[name] for name in reachable] == ["SASL_PLAINTEXT"]  # the rest only on loopback
    # learners run as nobody under a root platform, outside its data dir; the API is never open
    assert (platform["user"], environment["FFDL_LEARNER_USER"]) == ("0:0", "nobody")
    assert not Path(environment["FFDL_LEARNERS_DIR"]).is_relative_to(environment["FFDL_DATA_DIR"])
    assert "--open" not in platform["command"]
    # learners run sandboxed: the image has bubblewrap, the container lets it make namespaces
    assert environment.get("FFDL_SANDBOX", "bwrap") == "bwrap" and "--no-sandbox" not in platform["command"]
    assert "seccomp=unconfined" in platform["security_opt"]
    assert "bubblewrap" in (DEPLOY / "Dockerfile").read_text()
