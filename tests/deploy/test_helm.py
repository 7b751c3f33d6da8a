"""The Helm chart (deploy/helm/switchyard), rendered by a real helm 3 and checked against the
Kubernetes API's published JSON schemas (kubernetes-validate, offline, strict: no unknown
field) and prometheus-operator's ServiceMonitor model (cloudcoil's, generated from its CRD)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.helm import helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "switchyard"
RELEASE = "sy"
NAMESPACE = "mlops"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version())

SECRET_KEY = "k" * 30 + "-secret-key-value-never-in-a-configmap"
DB_URL = "postgres://switchyard:db-password-xyz@pg.example:5432/switchyard"
REDIS_URL = "redis://:redis-password-xyz@redis.example:6379/0"
METRICS_TOKEN = "metrics-token-value-xyz"
MINIMAL = {"secretKey": SECRET_KEY, "database": {"url": DB_URL}, "redis": {"url": REDIS_URL}}
EVERYTHING = {
    **MINIMAL,
    "metrics": {"token": METRICS_TOKEN, "allowNets": ["10.0.0.0/8"]},
    "s3": {"accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "s3-secret-xyz"},
    "web": {"replicaCount": 4},
    "worker": {"replicaCount": 7, "concurrency": 3, "queues": ["celery"]},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
    "ingress": {"enabled": True, "className": "nginx",
                "hosts": [{"host": "switchyard.example.com",
                           "paths": [{"path": "/", "pathType": "Prefix"}]}],
                "tls": [{"secretName": "sy-tls", "hosts": ["switchyard.example.com"]}]},
    "config": {"allowedHosts": ["console.internal"], "extra": {"SWITCHYARD_AUDIT_RETENTION_DAYS": 365}},
}
EXISTING = {
    "existingSecret": "switchyard-credentials",
    "existingSecretKeys": {"secretKey": "django-key", "databaseUrl": "pg", "redisUrl": "redis"},
    "serviceMonitor": {"enabled": True},
}
SCENARIOS = {"minimal": MINIMAL, "everything": EVERYTHING, "existing-secret": EXISTING}
SECRET_VALUES = (SECRET_KEY, DB_URL, REDIS_URL, METRICS_TOKEN, "s3-secret-xyz",
                 "db-password-xyz", "redis-password-xyz")


def helm(*args: str, values: dict | None = None, tmp_path: Path | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(helm_binary()), *args]
    if values is not None:
        assert tmp_path is not None
        path = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def render(values: dict, tmp_path: Path) -> list[dict]:
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
               values=values, tmp_path=tmp_path).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refusal(values: dict, tmp_path: Path) -> str:
    done = helm("template", RELEASE, str(CHART), values=values, tmp_path=tmp_path, check=False)
    assert done.returncode != 0, "rendered although it should have been refused"
    return done.stderr


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def workload(docs: list[dict], component: str) -> dict:
    [found] = [d for d in docs if d["kind"] in ("Deployment", "Job")
               and d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    return {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
            for d in docs if d["kind"] in ("Deployment", "Job")}


def env_of(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def is_hook(doc: dict) -> bool:
    return "helm.sh/hook" in doc["metadata"].get("annotations", {})


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("values")
    return {name: render(values, tmp) for name, values in SCENARIOS.items()}


def test_the_binary_is_helm_3():
    version = helm("version", "--short").stdout
    assert version.startswith("v3."), version


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_passes(scenario, tmp_path):
    done = helm("lint", "--strict", str(CHART), values=SCENARIOS[scenario], tmp_path=tmp_path)
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_is_valid_for_the_kubernetes_api(rendered, scenario, version):
    checked = set()
    for doc in rendered[scenario]:
        if doc["kind"] == "ServiceMonitor":
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "ConfigMap", "Job", "ServiceAccount",
            "PodDisruptionBudget"} <= checked


def test_the_validator_refuses_a_wrong_manifest(rendered):
    """The schemas bite: an unknown field and a wrong type are refused."""
    web = yaml.safe_load(yaml.safe_dump(workload(rendered["minimal"], "web")))
    web["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBE_VERSIONS[0], strict=True)
    web = yaml.safe_load(yaml.safe_dump(workload(rendered["minimal"], "web")))
    web["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBE_VERSIONS[0], strict=True)


def _unknown_keys(given: Any, parsed: Any, where: str = "") -> list[str]:
    """Keys of ``given`` that the model dropped (pydantic ignores fields it does not know)."""
    if isinstance(given, dict) and isinstance(parsed, dict):
        return [k for key, value in given.items()
                for k in ([f"{where}.{key}"] if key not in parsed
                          else _unknown_keys(value, parsed[key], f"{where}.{key}"))]
    if isinstance(given, list) and isinstance(parsed, list):
        return [k for i, (a, b) in enumerate(zip(given, parsed, strict=True))
                for k in _unknown_keys(a, b, f"{where}[{i}]")]
    return []


def _validate_service_monitor(doc: dict) -> None:
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    parsed = ServiceMonitor.model_validate(doc).model_dump(by_alias=True, exclude_none=True)
    assert _unknown_keys(doc, parsed) == []


def test_the_service_monitor_matches_the_prometheus_operator_crd(rendered):
    for scenario in ("everything", "existing-secret"):
        [monitor] = by_kind(rendered[scenario], "ServiceMonitor").values()
        _validate_service_monitor(monitor)
    wrong = yaml.safe_load(yaml.safe_dump(monitor))
    wrong["spec"]["endpoints"][0]["bearerTokenSecrett"] = {"name": "x", "key": "y"}
    with pytest.raises(AssertionError):
        _validate_service_monitor(wrong)


def test_the_service_monitor_scrapes_metrics_with_the_token(rendered, tmp_path):
    docs = rendered["everything"]
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    secret = by_kind(docs, "Secret")[credentials["name"]]
    assert credentials["key"] in secret["data"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    web_service = by_kind(docs, "Service")[f"{RELEASE}-switchyard-web"]
    assert web_service["spec"]["ports"][0]["name"] == "http"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        web_service["metadata"]["labels"].items())
    # Off by default; refused without a token (/metrics would answer 403).
    assert not by_kind(rendered["minimal"], "ServiceMonitor")
    stderr = refusal({**MINIMAL, "serviceMonitor": {"enabled": True}}, tmp_path)
    assert "metrics.token" in stderr


def test_beat_is_one_replica_that_is_recreated(rendered):
    for scenario in SCENARIOS:
        beat = workload(rendered[scenario], "beat")
        assert beat["spec"]["replicas"] == 1
        assert beat["spec"]["strategy"] == {"type": "Recreate"}
        [container] = beat["spec"]["template"]["spec"]["containers"]
        assert container["command"][:4] == ["celery", "-A", "console", "beat"]
        schedule = container["command"][container["command"].index("--schedule") + 1]
        mounts = [m["mountPath"] for m in container["volumeMounts"]]
        assert any(schedule.startswith(m + "/") for m in mounts), "beat's schedule is writable"


def test_replicas_follow_the_values(rendered):
    assert workload(rendered["minimal"], "web")["spec"]["replicas"] == 2
    assert workload(rendered["minimal"], "worker")["spec"]["replicas"] == 2
    assert workload(rendered["everything"], "web")["spec"]["replicas"] == 4
    worker = workload(rendered["everything"], "worker")
    assert worker["spec"]["replicas"] == 7
    command = worker["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:4] == ["celery", "-A", "console", "worker"]
    assert command[command.index("--concurrency") + 1] == "3"
    assert command[command.index("-Q") + 1] == "celery"


@pytest.mark.parametrize("values, message", [
    ({"beat": {"replicaCount": 2}}, "beat.replicaCount"),
    ({"worker": {"replicaCount": -1}}, "worker.replicaCount"),
    ({"web": {"replicaCount": -3}}, "web.replicaCount"),
    ({"web": {"replicas": 3}}, "replicas"),
    ({"config": {"extra": {"SWITCHYARD_METRICS_TOKEN": "x"}}}, "extra"),
    ({"config": {"extra": {"DEBUG": "true"}}}, "extra"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
    ({"worker": {"resources": {"requests": None}}}, "requests"),  # null deletes a default
    ({"secretKey": "short"}, "secretKey"),
    ({"database": {"url": "mysql://x@y/z"}}, "database.url"),
])
def test_the_schema_refuses(values, message, tmp_path):
    merged = {**MINIMAL, **values}
    stderr = refusal(merged, tmp_path)
    assert "schema" in stderr and message in stderr, stderr


def test_credentials_are_required_without_an_existing_secret(tmp_path):
    stderr = refusal({}, tmp_path)
    for name in ("secretKey", "database.url", "redis.url"):
        assert name in stderr, stderr


def test_migrations_run_as_a_hook_before_install_and_upgrade(rendered):
    for scenario in SCENARIOS:
        docs = rendered[scenario]
        job = workload(docs, "migrate")
        assert job["kind"] == "Job"
        annotations = job["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        [container] = job["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["python", "manage.py", "migrate", "--noinput"]
        # What it reads exists before it runs: hooks of a lower weight, or existingSecret.
        hooks = {(d["kind"], d["metadata"]["name"]): d for d in docs if is_hook(d)}
        config = container["envFrom"][0]["configMapRef"]["name"]
        secrets = {v["secretKeyRef"]["name"] for v in env_of(container).values()
                   if isinstance(v, dict) and "secretKeyRef" in v}
        needed = [("ConfigMap", config)] + [("Secret", s) for s in secrets
                                            if s != SCENARIOS[scenario].get("existingSecret")]
        for key in needed:
            weight = int(hooks[key]["metadata"]["annotations"]["helm.sh/hook-weight"])
            assert weight < int(annotations["helm.sh/hook-weight"])
        assert {d["kind"] for d in docs if is_hook(d)} <= {"Job", "ConfigMap", "Secret"}


def test_probes(rendered):
    web = workload(rendered["minimal"], "web")["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        get = web[probe]["httpGet"]
        assert (get["path"], get["port"]) == ("/login/", "http")
        headers = {h["name"]: h["value"] for h in get["httpHeaders"]}
        allowed = env_of(web)["SWITCHYARD_ALLOWED_HOSTS"].split(",")
        assert headers["Host"] in allowed
    worker = workload(rendered["minimal"], "worker")["spec"]["template"]["spec"]["containers"][0]
    assert "celery -A console inspect ping" in worker["livenessProbe"]["exec"]["command"][-1]


def test_no_secret_value_outside_a_secret(rendered):
    for scenario in SCENARIOS:
        for doc in rendered[scenario]:
            if doc["kind"] == "Secret":
                continue
            text = yaml.safe_dump(doc)
            leaked = [v for v in SECRET_VALUES if v in text]
            assert leaked == [], f"{doc['kind']}/{doc['metadata']['name']} holds {leaked}"
        for name, spec in pod_specs(rendered[scenario]).items():
            for container in spec["containers"]:
                env = env_of(container)
                for var in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL"):
                    assert "secretKeyRef" in env[var], f"{name} {var}"


def test_the_config_map_sets_settings_the_product_reads(rendered):
    """Every ConfigMap key is a variable console/settings.py (or an app) reads: a misspelled
    name would be ignored in silence."""
    sources = "\n".join(p.read_text() for app in ("console", "fleet", "rollouts")
                        for p in (ROOT / app).rglob("*.py"))
    [config] = [d for d in by_kind(rendered["everything"], "ConfigMap").values() if not is_hook(d)]
    unread = [k for k in config["data"] if f'"{k}"' not in sources]
    assert unread == []
    assert config["data"]["SWITCHYARD_PRODUCTION"] == "true"
    assert config["data"]["SWITCHYARD_METRICS_ALLOW_NETS"] == "10.0.0.0/8"
    assert config["data"]["SWITCHYARD_AUDIT_RETENTION_DAYS"] == "365"


def test_every_container_asks_for_cpu_and_memory(rendered):
    for scenario in SCENARIOS:
        for name, spec in pod_specs(rendered[scenario]).items():
            for container in spec["containers"]:
                resources = container["resources"]
                assert {"cpu", "memory"} <= resources["requests"].keys(), name
                assert {"cpu", "memory"} <= resources["limits"].keys(), name


def test_pods_run_as_non_root_on_a_read_only_root(rendered):
    for scenario in SCENARIOS:
        for name, spec in pod_specs(rendered[scenario]).items():
            assert spec["securityContext"]["runAsNonRoot"] is True, name
            assert spec["securityContext"]["runAsUser"] != 0, name
            assert spec["automountServiceAccountToken"] is False, name
            for container in spec["containers"]:
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False, name
                assert context["readOnlyRootFilesystem"] is True, name
                assert context["capabilities"]["drop"] == ["ALL"], name
                mounts = {m["mountPath"] for m in container["volumeMounts"]}
                assert {"/tmp", "/srv/switchyard/data"} <= mounts, name


def test_existing_secret_replaces_the_charts_own(rendered):
    docs = rendered["existing-secret"]
    assert by_kind(docs, "Secret") == {}
    keys = {"SECRET_KEY": "django-key", "DATABASE_URL": "pg", "REDIS_URL": "redis",
            "SWITCHYARD_METRICS_TOKEN": "SWITCHYARD_METRICS_TOKEN"}
    for name, spec in pod_specs(docs).items():
        env = env_of(spec["containers"][0])
        for var, key in keys.items():
            assert env[var]["secretKeyRef"]["name"] == "switchyard-credentials", name
            assert env[var]["secretKeyRef"]["key"] == key, name
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == (
        "switchyard-credentials")


def test_references_name_rendered_objects(rendered):
    for scenario in ("minimal", "everything"):
        docs = rendered[scenario]
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        for name, spec in pod_specs(docs).items():
            assert ("ServiceAccount", spec["serviceAccountName"]) in names
            for container in spec["containers"]:
                for source in container["envFrom"]:
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names, name
                for value in env_of(container).values():
                    if isinstance(value, dict) and "secretKeyRef" in value:
                        ref = value["secretKeyRef"]
                        secret = by_kind(docs, "Secret")[ref["name"]]
                        assert ref["key"] in secret["data"], f"{name} {ref}"


def test_services_and_the_budget_select_their_pods(rendered):
    docs = rendered["everything"]
    services = by_kind(docs, "Service")
    for component, port in (("web", ("http", "TCP")), ("collector", ("syslog", "UDP"))):
        service = services[f"{RELEASE}-switchyard-{component}"]
        pods = workload(docs, component)["spec"]["template"]
        assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
        others = [d for d in docs if d["kind"] == "Deployment" and d is not workload(docs, component)]
        assert all(not service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]
                   ["labels"].items() for d in others), "the selector picks one component only"
        [svc_port] = service["spec"]["ports"]
        assert (svc_port["targetPort"], svc_port["protocol"]) == port
        container_ports = {p["name"]: p["protocol"] for p in pods["spec"]["containers"][0]["ports"]}
        assert container_ports[port[0]] == port[1]
    [budget] = by_kind(docs, "PodDisruptionBudget").values()
    web_pods = workload(docs, "web")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= web_pods.items()


def test_the_collector_is_where_routers_send(rendered):
    docs = rendered["minimal"]
    collector = workload(docs, "collector")["spec"]["template"]["spec"]["containers"][0]
    assert collector["command"][:3] == ["python", "manage.py", "collect_samples"]
    assert collector["command"][collector["command"].index("--host") + 1] == "0.0.0.0"
    assert (ROOT / "rollouts" / "management" / "commands" / "collect_samples.py").is_file()
    [config] = [d for d in by_kind(docs, "ConfigMap").values() if not is_hook(d)]
    assert config["data"]["SWITCHYARD_COLLECTOR_HOST"] == (
        f"{RELEASE}-switchyard-collector.{NAMESPACE}.svc")
    assert config["data"]["SWITCHYARD_COLLECTOR_PORT"] == "5514"


def test_the_ingress_hosts_are_allowed_hosts(rendered):
    docs = rendered["everything"]
    [ingress] = by_kind(docs, "Ingress").values()
    [rule] = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] in by_kind(docs, "Service")
    web = workload(docs, "web")["spec"]["template"]["spec"]["containers"][0]
    allowed = env_of(web)["SWITCHYARD_ALLOWED_HOSTS"].split(",")
    assert {"switchyard.example.com", "console.internal", "$(POD_IP)"} <= set(allowed)
    # $(POD_IP) is expanded by the kubelet from a variable defined before it.
    names = [e["name"] for e in web["env"]]
    assert names.index("POD_IP") < names.index("SWITCHYARD_ALLOWED_HOSTS")


def test_a_changed_setting_rolls_the_pods(rendered, tmp_path):
    before = workload(rendered["minimal"], "worker")["spec"]["template"]["metadata"]
    after = workload(render({**MINIMAL, "config": {"logLevel": "DEBUG"}}, tmp_path), "worker")
    assert before["annotations"]["checksum/config"] != (
        after["spec"]["template"]["metadata"]["annotations"]["checksum/config"])


def _notes(values: dict, tmp_path: Path) -> str:
    """NOTES.txt as `helm install` prints it (helm template leaves it out): a copy of the chart
    where it is rendered into a ConfigMap."""
    chart = Path(tempfile.mkdtemp(dir=tmp_path)) / "switchyard"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "notes" }}' + notes + "{{- end }}")
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "notes" . | quote }}}\n')
    out = helm("template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only",
               "templates/notes.yaml", values=values, tmp_path=tmp_path).stdout
    return yaml.safe_load(out)["data"]["notes"]


def test_the_notes_say_how_to_begin(tmp_path):
    notes = _notes(MINIMAL, tmp_path)
    assert f"exec -it deploy/{RELEASE}-switchyard-web -- python manage.py createsuperuser" in notes
    assert f"port-forward svc/{RELEASE}-switchyard-web 8000:8000" in notes
    assert f"udp://{RELEASE}-switchyard-collector.{NAMESPACE}.svc:5514" in notes
    assert "https://switchyard.example.com/" in _notes(EVERYTHING, tmp_path)


def test_every_value_is_commented():
    """values.yaml explains each value of the first two levels: a comment line above it, or
    above the block it belongs to (a Kubernetes object given whole, such as a securityContext)."""
    lines = (CHART / "values.yaml").read_text().splitlines()

    def commented(i: int) -> bool:
        return i > 0 and lines[i - 1].lstrip().startswith("#")

    bare, block_commented = [], False
    for i, line in enumerate(lines):
        if re.match(r"^[A-Za-z][A-Za-z0-9]*:", line):
            block_commented = commented(i)
        if (re.match(r"^(  )?[A-Za-z][A-Za-z0-9]*:", line) and not line.rstrip().endswith(":")
                and not commented(i) and not (line.startswith("  ") and block_commented)):
            bare.append(line)
    assert bare == []
