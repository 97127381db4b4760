"""Deployment artifacts under deploy/: they parse, fit together, and configure metasrv as meant.

Each environment a deployment hands to metasrv (compose, systemd, Kubernetes) is fed to the
real `load_settings`, so a misspelt `METASRV_` variable or a bad value fails here, not at 3am.
No Docker engine runs on the dev machines: the compose file is checked structurally, and with
`docker compose config` only where that client plugin exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from metasrv.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
K8S_DIR = DEPLOY / "k8s"
STANDALONE = DEPLOY / "config" / "standalone.toml"
PRODUCTION = DEPLOY / "config" / "production.toml"

_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}")
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# ---------------------------------------------------------------- helpers


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: top level is not a mapping"
    return docs


def _assert_override_names(env: Mapping[str, str]) -> None:
    """Every METASRV_ name must address a real `section__field` of Settings (or a field of a
    nested table: `WAL__ARCHIVE__ENABLED`)."""
    for name in env:
        if not name.startswith("METASRV_"):
            continue
        section, *keys = name.removeprefix("METASRV_").lower().split("__")
        assert keys, f"{name}: nested settings need SECTION__FIELD"
        assert section in Settings.model_fields, f"{name}: no [{section}] section"
        model = Settings.model_fields[section].annotation
        path = section
        for key in keys:
            assert isinstance(model, type) and issubclass(model, BaseModel), f"{name}: {path}"
            assert key in model.model_fields, f"{name}: [{path}] has no field {key!r}"
            model = model.model_fields[key].annotation
            path = f"{path}.{key}"


SettingsFrom = Callable[[Path, Mapping[str, str]], Settings]


@pytest.fixture
def settings_from(monkeypatch: pytest.MonkeyPatch) -> SettingsFrom:
    """Build Settings from a TOML file plus exactly the given environment."""

    def build(config: Path, env: Mapping[str, str]) -> Settings:
        _assert_override_names(env)
        for name in list(os.environ):
            if name.startswith("METASRV_"):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return load_settings(config)

    return build


def _port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


# ---------------------------------------------------------------- example configs


def test_standalone_config_is_the_embedded_single_process_default() -> None:
    settings = load_settings(STANDALONE)
    assert settings.kv.backend == "sql"
    assert settings.kv.sql_url.startswith("sqlite:///")
    assert settings.history.url.startswith("sqlite:///")
    assert settings.http.addr == "127.0.0.1:4000"
    assert settings.wal.broker_endpoints == ["127.0.0.1:9092"]
    assert settings.wal.auto_prune_interval == 1800.0
    assert settings.wal.flush_trigger_size == 512 * 1024 * 1024
    assert settings.procedure.retry_delay == 0.5
    assert settings.auth.open_read is True


def test_production_config_uses_etcd_and_postgres_and_holds_no_secrets() -> None:
    settings = load_settings(PRODUCTION)
    assert settings.kv.backend == "etcd"
    # Production shape: three etcd members, three brokers at RF 3 / min ISR 2.
    assert len(settings.kv.etcd_endpoints) == 3
    assert len(settings.wal.broker_endpoints) == 3
    assert settings.history.url.startswith("postgresql+psycopg://")
    assert ":" not in settings.history.url.split("//", 1)[1].split("@", 1)[0], "password in file"
    assert settings.http.addr == "0.0.0.0:4000"
    assert settings.wal.replication_factor == 3
    assert settings.wal.min_insync_replicas == 2
    assert settings.wal.topic_creation_config()["min.insync.replicas"] == "2"
    assert settings.auth.open_read is False
    assert settings.auth.datanode_tokens == []
    assert settings.auth.operator_tokens == []
    assert settings.auth.viewer_tokens == []


# ---------------------------------------------------------------- docker compose


def _compose() -> dict[str, Any]:
    (doc,) = _yaml_docs(COMPOSE_DIR / "docker-compose.yml")
    return doc


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with nothing set; any other `$` form is a mistake here."""
    resolved = _COMPOSE_VAR.sub(lambda m: m.group(2), value)
    assert "$" not in resolved, f"unresolved or default-less variable in {value!r}"
    return resolved


def _compose_env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service["environment"]
    assert isinstance(env, dict), "use the mapping form of environment"
    return {name: _interpolate(str(value)) for name, value in env.items()}


def _mount_source(service: Mapping[str, Any], target: str) -> Path:
    for volume in service["volumes"]:
        source, mount, *_ = str(volume).split(":")
        if mount == target:
            return (COMPOSE_DIR / source).resolve()
    raise AssertionError(f"nothing mounted at {target}")


def test_compose_has_every_service_and_kraft_kafka() -> None:
    services = _compose()["services"]
    expected = {"kafka", "etcd", "postgres", "migrate", "metasrv-1", "metasrv-2"}
    assert expected | {"prometheus", "grafana"} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert set(kafka["environment"]["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("zookeeper" in name for name in services)


@pytest.mark.parametrize("name", ["metasrv-1", "metasrv-2"])
def test_compose_replica_builds_the_project_image_and_mounts_production_config(name: str) -> None:
    service = _compose()["services"][name]
    context = (COMPOSE_DIR / service["build"]["context"]).resolve()
    assert context == REPO
    assert (context / service["build"]["dockerfile"]).resolve() == COMPOSE_DIR / "Dockerfile"
    assert _mount_source(service, "/etc/metasrv/metasrv.toml") == PRODUCTION
    assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "/readyz" in " ".join(service["healthcheck"]["test"])


def test_compose_replicas_get_etcd_postgres_tokens_and_names(settings_from: SettingsFrom) -> None:
    services = _compose()["services"]
    names = set()
    for name in ("metasrv-1", "metasrv-2"):
        settings = settings_from(PRODUCTION, _compose_env(services[name]))
        assert settings.kv.backend == "etcd"
        assert settings.kv.etcd_endpoints == ["etcd:2379"]
        assert settings.wal.broker_endpoints == ["kafka:9092"]
        assert settings.wal.replication_factor == 1
        assert settings.wal.min_insync_replicas == 1
        assert settings.history.url == "postgresql+psycopg://metasrv:metasrv@postgres:5432/metasrv"
        assert settings.auth.operator_tokens == ["dev-operator-token"]
        assert settings.auth.datanode_tokens == ["dev-datanode-token"]
        assert settings.auth.open_read is True
        # Healthcheck and published port both target the port metasrv listens on.
        port = _port(settings.http.addr)
        assert f"127.0.0.1:{port}/readyz" in " ".join(services[name]["healthcheck"]["test"])
        assert [str(p).rsplit(":", 1)[1] for p in services[name]["ports"]] == [str(port)]
        names.add(settings.node_name)
    assert names == {"metasrv-1:4000", "metasrv-2:4000"}


def test_compose_migrate_runs_db_upgrade_against_postgres(settings_from: SettingsFrom) -> None:
    service = _compose()["services"]["migrate"]
    assert service["command"][:2] == ["db", "upgrade"]
    assert service["restart"] == "no"
    settings = settings_from(PRODUCTION, _compose_env(service))
    assert settings.history.url.startswith("postgresql+psycopg://metasrv:")


def test_compose_monitoring_mounts_the_shared_prometheus_and_grafana_files() -> None:
    services = _compose()["services"]
    prom = _mount_source(services["prometheus"], "/etc/prometheus/prometheus.yml")
    assert prom == DEPLOY / "prometheus" / "prometheus.yml"
    grafana = services["grafana"]
    assert _mount_source(grafana, "/var/lib/grafana/dashboards/metasrv") == DEPLOY / "grafana"
    provisioning = _mount_source(grafana, "/etc/grafana/provisioning/dashboards")
    (provider,) = _yaml_docs(provisioning / "metasrv.yml")[0]["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/metasrv"
    datasources = _mount_source(grafana, "/etc/grafana/provisioning/datasources")
    (source,) = _yaml_docs(datasources / "prometheus.yml")[0]["datasources"]
    assert source["url"] == "http://prometheus:9090"


def test_compose_prometheus_scrapes_both_replicas() -> None:
    path = DEPLOY / "prometheus" / "prometheus.yml"
    if not path.exists():
        pytest.skip("deploy/prometheus/prometheus.yml is not written yet (another area owns it)")
    text = path.read_text()
    for target in ("metasrv-1:4000", "metasrv-2:4000"):
        assert target in text, f"prometheus.yml does not scrape {target}"


def test_compose_file_passes_docker_compose_config() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    probe = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"docker client has no compose plugin: {probe.stderr.strip()[:200]}")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_DIR / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=COMPOSE_DIR,
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- systemd


def _unit() -> dict[str, list[str]]:
    """Unit file keys to values (a key may repeat); sections are not needed here."""
    entries: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / "metasrv.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            entries.setdefault(key, []).append(value)
    return entries


def _env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"{path}: not NAME=VALUE: {line!r}"
            env[name] = value
    return env


def test_systemd_unit_starts_the_daemon_with_its_env_file() -> None:
    unit = _unit()
    assert unit["ExecStart"] == ["/opt/metasrv/bin/metasrv start -c /etc/metasrv/metasrv.toml"]
    assert unit["EnvironmentFile"] == ["/etc/metasrv/metasrv.env"]
    assert unit["User"] == ["metasrv"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["WantedBy"] == ["multi-user.target"]


def test_systemd_env_example_configures_a_production_replica(settings_from: SettingsFrom) -> None:
    env = _env_file(DEPLOY / "systemd" / "metasrv.env.example")
    settings = settings_from(PRODUCTION, env)
    assert settings.kv.backend == "etcd"
    assert len(settings.kv.etcd_endpoints) == 3
    assert len(settings.wal.broker_endpoints) == 3
    assert settings.history.url.startswith("postgresql+psycopg://metasrv:")
    assert settings.auth.operator_tokens == ["replace-with-operator-token"]
    assert settings.auth.datanode_tokens == ["replace-with-datanode-token"]
    assert settings.auth.viewer_tokens == ["replace-with-viewer-token"]
    assert settings.node_name == "metasrv-1.example.internal:4000"


# ---------------------------------------------------------------- kubernetes


def _k8s() -> dict[str, dict[str, Any]]:
    """Every manifest under deploy/k8s, keyed by kind (one object of each kind here), the
    archivers' (`app.kubernetes.io/component: archiver`) as "Archiver" + kind."""
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in _yaml_docs(path):
            assert "kind" in doc and "apiVersion" in doc, path
            key = doc["kind"]
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"], path
                labels = doc["metadata"].get("labels", {})
                if labels.get("app.kubernetes.io/component") == "archiver":
                    key = "Archiver" + key
            assert key not in objects, f"second {key} in {path}"
            objects[key] = doc
    return objects


def _container(spec: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = spec["template"]["spec"]["containers"]
    return dict(container)


def _configmap_toml(tmp_path: Path) -> Path:
    path = tmp_path / "metasrv.toml"
    path.write_text(_k8s()["ConfigMap"]["data"]["metasrv.toml"])
    return path


def test_k8s_kustomization_lists_the_manifests() -> None:
    kustomization = _k8s()["Kustomization"]
    listed = set(kustomization["resources"])
    expected = {
        "configmap.yaml",
        "secret.yaml",
        "deployment.yaml",
        "archiver.yaml",
        "service.yaml",
        "pdb.yaml",
        "pvc.yaml",
    }
    assert listed == expected
    assert all((K8S_DIR / name).is_file() for name in listed)


def test_k8s_configmap_is_the_production_config(tmp_path: Path) -> None:
    in_configmap = tomllib.loads(_configmap_toml(tmp_path).read_text())
    assert in_configmap == tomllib.loads(PRODUCTION.read_text())


def test_k8s_deployment_replicas_probes_and_resources(tmp_path: Path) -> None:
    objects = _k8s()
    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] == 2
    container = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = _port(load_settings(_configmap_toml(tmp_path)).http.addr)
    probes = {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for probe, path in probes.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == listen
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert container["args"] == ["start", "-c", "/etc/metasrv/metasrv.toml"]
    # The config volume is the ConfigMap, mounted where -c points.
    volumes = {v["name"]: v for v in deployment["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/metasrv"]
    assert volumes[mount["name"]]["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]


def test_k8s_pods_write_the_stat_history_to_one_shared_volume(tmp_path: Path) -> None:
    """The root filesystem is read-only: stats_url must be a mounted, shared claim."""
    objects = _k8s()
    spec = objects["Deployment"]["spec"]["template"]["spec"]
    stats_url = load_settings(_configmap_toml(tmp_path)).history.stats_url
    (mount,) = [
        m
        for m in _container(objects["Deployment"]["spec"])["volumeMounts"]
        if m["mountPath"] == stats_url
    ]
    assert not mount.get("readOnly", False)
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    pvc = objects["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == claim
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_k8s_service_and_pdb_select_the_pods(tmp_path: Path) -> None:
    objects = _k8s()
    deployment = objects["Deployment"]["spec"]
    labels = deployment["template"]["metadata"]["labels"]
    assert deployment["selector"]["matchLabels"].items() <= labels.items()
    service = objects["Service"]["spec"]
    assert service["selector"].items() <= labels.items()
    (port,) = service["ports"]
    ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    listen = _port(load_settings(_configmap_toml(tmp_path)).http.addr)
    assert ports[port["targetPort"]] == listen
    pdb = objects["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["minAvailable"] == 1


def _k8s_env(
    container: Mapping[str, Any], secret: Mapping[str, str], pod_ip: str
) -> dict[str, str]:
    """Resolve a container's env as the kubelet would: literals, secrets, fieldRefs, $(VAR)."""
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            value = _K8S_VAR.sub(lambda m: env[m.group(1)], var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            value = secret[var["valueFrom"]["secretKeyRef"]["key"]]
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            value = pod_ip
        env[var["name"]] = value
    return env


def test_k8s_pod_env_and_secret_configure_an_etcd_replica(
    tmp_path: Path, settings_from: SettingsFrom
) -> None:
    objects = _k8s()
    secret = objects["Secret"]
    container = _container(objects["Deployment"]["spec"])
    refs = {
        v["valueFrom"]["secretKeyRef"]["name"]
        for v in container["env"]
        if "secretKeyRef" in v.get("valueFrom", {})
    }
    assert refs == {secret["metadata"]["name"]}
    env = _k8s_env(container, secret["stringData"], pod_ip="10.1.2.3")
    # Mount the Secret's token files as the kubelet would, under tmp_path.
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (tokens,) = [v for v in pod["volumes"] if "secret" in v]
    assert tokens["secret"]["secretName"] == secret["metadata"]["name"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == tokens["name"]]
    mounted = tmp_path / "tokens"
    mounted.mkdir()
    for item in tokens["secret"]["items"]:
        (mounted / item["path"]).write_text(secret["stringData"][item["key"]])
    env = {k: v.replace(mount["mountPath"], str(mounted)) for k, v in env.items()}
    settings = settings_from(_configmap_toml(tmp_path), env)
    assert settings.kv.backend == "etcd"
    assert settings.history.url.startswith("postgresql+psycopg://metasrv:")
    assert settings.auth.operator_tokens == ["replace-with-operator-token"]
    assert settings.auth.datanode_tokens == ["replace-with-datanode-token"]
    assert settings.auth.viewer_tokens == ["replace-with-viewer-token"]
    assert settings.node_name == "10.1.2.3:4000"


def test_k8s_db_upgrade_job_uses_the_same_config_and_secret(settings_from: SettingsFrom) -> None:
    objects = _k8s()
    job = objects["Job"]["spec"]
    container = _container(job)
    assert container["args"][:2] == ["db", "upgrade"]
    (volume,) = job["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    env = _k8s_env(container, objects["Secret"]["stringData"], pod_ip="10.1.2.4")
    assert settings_from(PRODUCTION, env).history.url.startswith("postgresql+psycopg://")


# ---------------------------------------------------------------- WAL archivers


def test_production_config_has_the_archive_section_off_and_no_secret() -> None:
    archive = load_settings(PRODUCTION).wal.archive
    assert archive.enabled is False
    assert archive.bucket and archive.prefix.endswith("/")
    assert archive.consumer_group == "metasrv-archive"
    assert archive.access_key_id == "" and archive.secret_access_key.get_secret_value() == ""


def test_k8s_archivers_run_two_ready_on_readyz_from_the_same_config(tmp_path: Path) -> None:
    objects = _k8s()
    deployment = objects["ArchiverDeployment"]["spec"]
    assert deployment["replicas"] == 2
    container = _container(deployment)
    assert container["args"] == ["archive", "-c", "/etc/metasrv/metasrv.toml"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = _port(load_settings(_configmap_toml(tmp_path)).http.addr)
    for probe, path in {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == listen
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    volumes = {v["name"]: v for v in deployment["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/metasrv"]
    assert volumes[mount["name"]]["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    # Its PDB keeps one through a drain; metasrv's Service and PDB never select an archiver.
    labels = deployment["template"]["metadata"]["labels"]
    assert deployment["selector"]["matchLabels"].items() <= labels.items()
    pdb = objects["ArchiverPodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["minAvailable"] == 1
    for selector in (
        objects["Service"]["spec"]["selector"],
        objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        objects["Deployment"]["spec"]["selector"]["matchLabels"],
    ):
        assert not selector.items() <= labels.items()


def test_k8s_metasrv_and_archivers_turn_the_archive_on_alike(
    tmp_path: Path, settings_from: SettingsFrom
) -> None:
    """Both read the ConfigMap with the archive on and the bucket's keys from the Secret:
    archivers that metasrv does not wait for, or a metasrv waiting for archivers that refuse
    to start, would be a half-on archive."""
    objects = _k8s()
    secret = objects["Secret"]["stringData"]
    config = _configmap_toml(tmp_path)
    archives = []
    for kind in ("Deployment", "ArchiverDeployment"):
        container = _container(objects[kind]["spec"])
        env = _k8s_env(container, secret, pod_ip="10.1.2.5")
        assert env["AWS_ACCESS_KEY_ID"] == secret["archiver_aws_access_key_id"]
        assert env["AWS_SECRET_ACCESS_KEY"] == secret["archiver_aws_secret_access_key"]
        # The token files are the metasrv pod's business; only the archive matters here.
        env = {k: v for k, v in env.items() if "TOKEN_FILES" not in k}
        archives.append(settings_from(config, env).wal.archive)
    assert archives[0].enabled and archives[0] == archives[1]


def test_systemd_archiver_unit_runs_metasrv_archive_like_the_daemon() -> None:
    unit: dict[str, list[str]] = {}
    text = (DEPLOY / "systemd" / "metasrv-archiver.service").read_text()
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            unit.setdefault(key, []).append(value)
    assert unit["ExecStart"] == ["/opt/metasrv/bin/metasrv archive -c /etc/metasrv/metasrv.toml"]
    daemon = _unit()
    for key in ("EnvironmentFile", "User", "WorkingDirectory", "Restart", "WantedBy"):
        assert unit[key] == daemon[key], key
    # A configuration error (exit 2: the archive off) is not retried in a loop.
    assert unit["RestartPreventExitStatus"] == ["2"]
    assert int(unit["TimeoutStopSec"][0]) >= 60


def test_deploy_readme_says_how_many_archivers_and_the_bucket_permissions() -> None:
    readme = (DEPLOY / "README.md").read_text()
    section = readme.split("## Archivers", 1)[1].split("\n## ", 1)[0]
    for needed in (
        "two",
        "s3:PutObject",
        "s3:GetObject",
        "s3:ListBucket",
        "s3:DeleteObject",
        "MetasrvWalArchiveLagging",
        "k8s/archiver.yaml",
        "systemd/metasrv-archiver.service",
    ):
        assert needed in section, needed
