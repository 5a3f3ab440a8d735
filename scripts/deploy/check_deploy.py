"""Deployment checks for zkq: Dockerfile, the zkq-sidecar library chart and the zkq-demo chart.

Run through scripts/check-deploy.sh, which provides the virtualenv (helm-python-sdk,
kubernetes-validate, hadolint, yamllint) and the zkq binary. Every check prints one line; the run
ends with "deploy checks: N passed, M failed" and exits non-zero when M > 0.

    python scripts/deploy/check_deploy.py --zkq-bin target/release/zkq [--sync]
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

import helm_python as helm
import helm_python.registry as helm_registry
import jsonschema
import yaml
from helm_python import _native

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "helm" / "zkq-sidecar"
DEMO = ROOT / "helm" / "zkq-demo"
CI_VALUES = DEMO / "ci"
DEPLOY = ROOT / "scripts" / "deploy"
MONITORING = ROOT / "helm" / "monitoring"
DASHBOARD_TPL = LIB / "templates" / "_dashboard.tpl"
OPERATIONS = ROOT / "docs" / "operations.md"
KUBE_VERSION = "1.30.0"
RELEASE = "demo"
NAMESPACE = "zkq-demo"
SIX_LABELS = ["name", "instance", "version", "component", "part-of", "managed-by"]
# Where the chart mounts the Secrets of zkq.tlsSecret, zkq.saslSecret and zkq.apiTokenSecret.
SECRETS_DIR = "/var/run/secrets/zkq"


class Checks:
    """Counts and prints checks; a failing check never stops the run."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def ok(self, what: str, cond: bool, detail: str = "") -> bool:
        if cond:
            self.passed += 1
            print(f"  ok    {what}")
        else:
            self.failed.append(what)
            print(f"  FAIL  {what}" + (f"\n        {detail}" if detail else ""))
        return cond

    def section(self, title: str) -> None:
        print(f"\n==> {title}")


C = Checks()


# --- helpers ---------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def render(chart: helm.Chart, values: dict[str, Any], kube_version: str = KUBE_VERSION) -> dict[str, str]:
    """helm template equivalent. Chart.render() has no kube_version parameter, but the native
    helm_render call it wraps accepts one (helm-python-sdk 0.2.2), so the templates see the same
    .Capabilities.KubeVersion as the lint and the schema validation."""
    opts = {"name": RELEASE, "namespace": NAMESPACE, "kube_version": f"v{kube_version}", "is_install": True}
    out = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
    return json.loads(out)


def documents(rendered: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for source, text in sorted(rendered.items()):
        if source.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((source, doc))
    return docs


def manifest_text(rendered: dict[str, str], keep: Callable[[dict[str, Any]], bool]) -> str:
    """The rendered documents that `keep` accepts, as one multi-document YAML stream, each
    document verbatim as Helm rendered it (so yamllint sees Helm's own output)."""
    parts = []
    for source, text in sorted(rendered.items()):
        if source.endswith("NOTES.txt"):
            continue
        for chunk in re.split(r"(?m)^---\s*$", text):
            if not chunk.strip():
                continue
            doc = yaml.safe_load(chunk)
            if doc and keep(doc):
                parts.append(f"---\n# Source: {source}\n{chunk.strip(chr(10))}\n")
    return "".join(parts)


def run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def grace_seconds(grace: str) -> int:
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h)", grace)
    if not m:
        raise ValueError(f"unexpected grace {grace!r}")
    n, unit = int(m.group(1)), m.group(2)
    return {"ms": (n + 999) // 1000, "s": n, "m": n * 60, "h": n * 3600}[unit]


def deep_merge(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dst)
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# --- checks ----------------------------------------------------------------------------------


def build_dependencies() -> None:
    """`helm dependency update` of the demo chart: packages helm/zkq-sidecar (a `file://`
    dependency, so no network) into helm/zkq-demo/charts/, which is not committed."""
    charts = DEMO / "charts"
    if charts.exists():
        shutil.rmtree(charts)
    helm_registry.dependency_update(DEMO, skip_refresh=True)


def sync() -> None:
    """Refresh the demo schema's `zkq` part from helm/zkq-sidecar, the library's dashboard template
    from helm/monitoring/zkq-dashboard.json, and helm/monitoring/zkq-alerts.yaml from the library's
    rules rendered with their default values."""
    demo_schema_path = DEMO / "values.schema.json"
    demo_schema = json.loads(demo_schema_path.read_text())
    demo_schema["properties"]["zkq"] = json.loads((LIB / "values.schema.json").read_text())["properties"]["zkq"]
    demo_schema_path.write_text(json.dumps(demo_schema, indent=2) + "\n")
    print(f"synced properties.zkq of {demo_schema_path.relative_to(ROOT)}")
    DASHBOARD_TPL.write_text(dashboard_template())
    print(f"synced {DASHBOARD_TPL.relative_to(ROOT)} from helm/monitoring/zkq-dashboard.json")
    (MONITORING / "zkq-alerts.yaml").write_text(plain_rules())
    print("synced helm/monitoring/zkq-alerts.yaml from the library's rules with their default values")


def dashboard_template() -> str:
    """The library template holding helm/monitoring/zkq-dashboard.json verbatim: Grafana's `{{label}}`
    legends are escaped as `{{ "{{" }}` so Helm prints them as they are."""
    text = (MONITORING / "zkq-dashboard.json").read_text().rstrip("\n")
    escaped = re.sub(r"\{\{|\}\}", lambda m: '{{ "%s" }}' % m.group(0), text)
    return (
        "{{/*\nzkq-sidecar.dashboardJson: helm/monitoring/zkq-dashboard.json, verbatim. GENERATED from that file by\n"
        "scripts/check-deploy.sh --sync: edit the JSON, not this (the check fails when they differ).\n*/}}\n"
        '{{- define "zkq-sidecar.dashboardJson" -}}\n' + escaped + "\n{{- end -}}\n"
    )


def probe_render(template: str, values: dict[str, Any] | None = None) -> str:
    """Renders `template` in a probe chart that depends on the library (the library's named
    templates are only usable from an including chart)."""
    lib_chart = load_yaml(LIB / "Chart.yaml")
    probe = ROOT / "target" / "deploy-check" / "probe"
    if probe.exists():
        shutil.rmtree(probe)
    (probe / "templates").mkdir(parents=True)
    (probe / "charts").mkdir()
    shutil.copytree(LIB, probe / "charts" / "zkq-sidecar")
    (probe / "Chart.yaml").write_text(
        "apiVersion: v2\nname: probe\nversion: 0.0.0\n"
        f"dependencies:\n  - name: zkq-sidecar\n    version: {lib_chart['version']}\n    repository: file://x\n"
    )
    (probe / "templates" / "probe.yaml").write_text(template)
    with helm.Chart.load(probe) as chart:
        out = render(chart, values or {})
    return out["probe/templates/probe.yaml"]


def plain_rules() -> str:
    """helm/monitoring/zkq-alerts.yaml: the library's rule groups with the chart's default thresholds."""
    groups = probe_render('{{ include "zkq-sidecar.alertGroups" . }}\n')
    return (
        "# zkq's alerting rules, for a Prometheus without the operator (rule_files). GENERATED from\n"
        "# helm/zkq-sidecar/templates/_monitoring.tpl with the chart's default thresholds by\n"
        "# scripts/check-deploy.sh --sync; do not edit (the check fails when they differ). Change thresholds\n"
        "# here by editing a copy, or render the chart with your values. Tests: zkq-alerts.test.yaml.\n"
        "# Runbook: docs/operations.md, one section per alert.\n"
        + groups.rstrip("\n")
        + "\n"
    )


def check_consistency() -> None:
    C.section("consistency between the library chart, the demo and zkq")
    lib_schema = json.loads((LIB / "values.schema.json").read_text())
    demo_schema = json.loads((DEMO / "values.schema.json").read_text())
    C.ok(
        "zkq-demo values.schema.json embeds the library's `zkq` schema unchanged",
        demo_schema["properties"].get("zkq") == lib_schema["properties"]["zkq"],
        "run scripts/check-deploy.sh --sync",
    )
    lib_chart = load_yaml(LIB / "Chart.yaml")
    demo_chart = load_yaml(DEMO / "Chart.yaml")
    cargo_version = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
    lib_values = load_yaml(LIB / "values.yaml")["zkq"]
    C.ok("zkq-sidecar is a library chart", lib_chart.get("type") == "library")
    C.ok(
        f"library appVersion == zkq.image.tag default == Cargo.toml version ({cargo_version})",
        str(lib_chart.get("appVersion")) == str(lib_values["image"]["tag"]) == cargo_version,
        f"appVersion={lib_chart.get('appVersion')} tag={lib_values['image']['tag']} cargo={cargo_version}",
    )
    dockerfile = (ROOT / "Dockerfile").read_text()
    m = re.search(r"^ARG VERSION=(\S+)", dockerfile, re.M)
    C.ok("Dockerfile's default VERSION label == Cargo.toml version", bool(m) and m.group(1) == cargo_version)
    dep = next((d for d in demo_chart.get("dependencies", []) if d["name"] == "zkq-sidecar"), None)
    C.ok(
        "zkq-demo depends on zkq-sidecar at the library's version",
        dep is not None and str(dep["version"]) == str(lib_chart["version"]),
    )
    C.ok(
        "library Chart.yaml declares kubeVersion >= 1.29 (native sidecars)",
        str(lib_chart.get("kubeVersion", "")).replace(" ", "") == ">=1.29.0-0",
    )
    status = helm.dependency_list(DEMO)
    # A wrong version would read "wrong version", a missing one "missing".
    C.ok(
        "helm dependency list of zkq-demo: zkq-sidecar built from helm/zkq-sidecar at the declared version",
        [(d["name"], d["status"]) for d in status] == [("zkq-sidecar", "ok")],
        str(status),
    )
    # The library's documented values.yaml must equal the defaults its templates apply: render a
    # probe chart that includes the library and prints zkq-sidecar.values with no user values.
    out = {
        "probe/templates/values.yaml": probe_render(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\ndata:\n"
            '  values: {{ include "zkq-sidecar.values" . | quote }}\n'
        )
    }
    defaults = yaml.safe_load(yaml.safe_load(out["probe/templates/values.yaml"])["data"]["values"])
    C.ok(
        "library values.yaml `zkq` == defaults applied by the templates (zkq-sidecar.defaults)",
        defaults == lib_values,
        f"template defaults: {defaults}\nvalues.yaml: {lib_values}",
    )
    # Schema of the library accepts its own defaults (a schema that rejected them would break
    # every chart that depends on the library).
    try:
        jsonschema.validate({"zkq": lib_values}, lib_schema)
        C.ok("library values.yaml is valid against its values.schema.json", True)
    except jsonschema.ValidationError as e:
        C.ok("library values.yaml is valid against its values.schema.json", False, e.message)


def check_dockerfile() -> None:
    C.section("Dockerfile (static checks; hadolint runs in check-deploy.sh)")
    text = (ROOT / "Dockerfile").read_text()
    C.ok("BuildKit syntax directive on line 1", text.startswith("# syntax=docker/dockerfile:1"))
    # The base images are build arguments (a mirror or scripts/check-image.sh's local stand-ins
    # replace them), declared before the first FROM, with the upstream images as defaults.
    first_from = text.find("\nFROM ")
    for arg in ("RUST_IMAGE=rust:1-bookworm", "RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot"):
        C.ok(f"ARG {arg} before the first FROM", 0 <= text.find(f"\nARG {arg}\n") < first_from)
    C.ok("builder FROM ${RUST_IMAGE}", re.search(r"^FROM \$\{RUST_IMAGE\} AS \w+$", text, re.M) is not None)
    C.ok(
        "dependencies cooked in their own layer before the source is copied (cargo-chef)",
        re.search(r"cargo chef cook --release --locked[^\n]*\nCOPY \. \.", text) is not None,
    )
    C.ok("cargo build --release --locked", "cargo build --release --locked" in text)
    C.ok("runtime FROM ${RUNTIME_IMAGE}", re.search(r"^FROM \$\{RUNTIME_IMAGE\} AS runtime$", text, re.M) is not None)
    runtime = text.split("FROM ${RUNTIME_IMAGE} AS runtime", 1)[-1]
    C.ok(
        "the runtime stage labels its actual base (org.opencontainers.image.base.name=${RUNTIME_IMAGE})",
        re.search(r"^ARG RUNTIME_IMAGE$", runtime, re.M) is not None
        and 'org.opencontainers.image.base.name="${RUNTIME_IMAGE}"' in runtime,
    )
    C.ok("smoke test in the builder (zkq --version)", "/src/target/release/zkq --version" in text)
    C.ok("smoke test in the runtime image, exec form", 'RUN ["/usr/local/bin/zkq"' in runtime)
    C.ok("STOPSIGNAL SIGTERM", re.search(r"^STOPSIGNAL SIGTERM$", runtime, re.M) is not None)
    C.ok("EXPOSE 8080 9090", re.search(r"^EXPOSE 8080 9090$", runtime, re.M) is not None)
    C.ok(
        'HEALTHCHECK CMD ["/usr/local/bin/zkq", "healthcheck"] (exec form)',
        re.search(r'^\s*CMD \["/usr/local/bin/zkq", "healthcheck"\]$', runtime, re.M) is not None,
    )
    C.ok("USER is non-root (65532 = distroless nonroot)", re.search(r"^USER (65532(:65532)?|nonroot)$", runtime, re.M) is not None)
    C.ok("ENTRYPOINT exec form", re.search(r'^ENTRYPOINT \["/usr/local/bin/zkq"\]$', runtime, re.M) is not None)
    labels = set(re.findall(r"org\.opencontainers\.image\.([a-z.]+)=", runtime))
    C.ok(
        "OCI labels title, description, version, revision, source, licenses",
        {"title", "description", "version", "revision", "source", "licenses"} <= labels,
        str(sorted(labels)),
    )
    # .dockerignore must keep everything `cargo build` reads: the manifest, the lock file and the
    # paths of every target Cargo.toml declares.
    ignore = [
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    needed = ["Cargo.toml", "Cargo.lock", "src/main.rs", "src/lib.rs"]
    for section in ("lib", "bin", "test", "bench", "example"):
        entries = cargo.get(section, [])
        for entry in entries if isinstance(entries, list) else [entries]:
            if "path" in entry:
                needed.append(entry["path"])

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(
            fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.removeprefix("**/"))
            for p in prefixes
            for pat in ignore
        )

    excluded = [p for p in needed if ignored(p)]
    C.ok(
        ".dockerignore keeps Cargo.toml, Cargo.lock and every declared target path",
        not excluded,
        f"excluded: {excluded}",
    )
    C.ok(".dockerignore excludes target/ and .git", {"target", ".git"} <= set(ignore))


def lint_charts() -> None:
    C.section(f"helm lint --strict --kube-version {KUBE_VERSION} (Helm {helm.helm_sdk_version()})")

    def lint(path: Path, values: dict[str, Any] | None, label: str) -> None:
        report = helm.lint(path, values, strict=True, kube_version=f"v{KUBE_VERSION}")
        bad = [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]
        infos = [m["error"] for m in report["messages"] if m["severity"] < 2]
        C.ok(
            f"lint {label}" + (f" (info only: {'; '.join(sorted(set(infos)))})" if infos else ""),
            not bad,
            "\n        ".join(str(m.get("path", "")) + ": " + str(m["error"]).strip() for m in bad),
        )

    lint(LIB, None, "helm/zkq-sidecar (library)")
    for values_file in sorted(CI_VALUES.glob("*-values.yaml")):
        lint(DEMO, load_yaml(values_file) or {}, f"helm/zkq-demo with ci/{values_file.name}")


def check_case(name: str, values: dict[str, Any], rendered: dict[str, str], outdir: Path, zkq_bin: Path | None,
               venv_bin: Path) -> dict[str, str]:
    """Validates one rendering; returns its pod annotations (to compare cases)."""
    lib_defaults = load_yaml(LIB / "values.yaml")["zkq"]
    demo_values = deep_merge(load_yaml(DEMO / "values.yaml"), values)
    zkq_values = deep_merge(lib_defaults, demo_values.get("zkq", {}))
    native = zkq_values["nativeSidecar"]
    docs = documents(rendered)
    kinds = [d["kind"] for _, d in docs]
    outdir.mkdir(parents=True, exist_ok=True)

    def is_dashboard(d: dict[str, Any]) -> bool:
        return d.get("kind") == "ConfigMap" and "zkq.json" in (d.get("data") or {})

    def is_crd(d: dict[str, Any]) -> bool:
        return d.get("apiVersion") == "monitoring.coreos.com/v1"

    core = manifest_text(rendered, lambda d: not is_crd(d) and not is_dashboard(d))
    monitors = manifest_text(rendered, lambda d: d.get("kind") == "PodMonitor")
    rules = manifest_text(rendered, lambda d: d.get("kind") == "PrometheusRule")
    dashboard = manifest_text(rendered, is_dashboard)
    (outdir / "manifests.yaml").write_text(core)
    for file, text in [("podmonitor.yaml", monitors), ("prometheusrule.yaml", rules), ("dashboard.yaml", dashboard)]:
        if text:
            (outdir / file).write_text(text)
    (outdir / "NOTES.txt").write_text(rendered.get("zkq-demo/templates/NOTES.txt", ""))

    # Schema validation of every rendered object.
    core_kinds = [d["kind"] for _, d in docs if not is_crd(d) and not is_dashboard(d)]
    res = run([str(venv_bin / "kubernetes-validate"), "--strict", "-k", KUBE_VERSION, str(outdir / "manifests.yaml")])
    C.ok(
        f"kubernetes-validate --strict -k {KUBE_VERSION}: {len(core_kinds)} objects ({', '.join(core_kinds)})",
        res.returncode == 0 and res.stdout.count("passed") == len(core_kinds),
        (res.stdout + res.stderr).strip(),
    )
    pod_monitors = [d for _, d in docs if d["kind"] == "PodMonitor"]
    if pod_monitors:
        print(
            "  note  PodMonitor (monitoring.coreos.com/v1) is a CRD that kubernetes-validate does not bundle: it is\n"
            "        validated against scripts/deploy/podmonitor.schema.json, a minimal schema of the fields the chart\n"
            "        renders, not against the Prometheus operator's full CRD schema."
        )
        schema = json.loads((DEPLOY / "podmonitor.schema.json").read_text())
        errors = [e.message for pm in pod_monitors for e in jsonschema.Draft7Validator(schema).iter_errors(pm)]
        C.ok(f"PodMonitor valid against the minimal local schema ({len(pod_monitors)} object)", not errors, "; ".join(errors))

    # yamllint on Helm's output. Alert descriptions and the dashboard's JSON are long single
    # lines, so those two objects are linted without the line-length rule.
    files = [str(outdir / "manifests.yaml")] + ([str(outdir / "podmonitor.yaml")] if monitors else [])
    res = run([str(venv_bin / "yamllint"), "-s", "-c", str(DEPLOY / "yamllint.yaml"), *files])
    C.ok("yamllint (strict) on the rendered manifests", res.returncode == 0, (res.stdout + res.stderr).strip())
    long_lines = [str(outdir / f) for f, text in [("prometheusrule.yaml", rules), ("dashboard.yaml", dashboard)] if text]
    if long_lines:
        res = run([str(venv_bin / "yamllint"), "-s", "-d", yamllint_long_lines(), *long_lines])
        C.ok("yamllint (strict, any line length) on the rendered PrometheusRule and dashboard ConfigMap",
             res.returncode == 0, (res.stdout + res.stderr).strip())
    check_monitoring_objects(docs, zkq_values, outdir, venv_bin, is_dashboard)

    # Structure.
    deployments = [d for _, d in docs if d["kind"] == "Deployment"]
    configmaps = [d for _, d in docs if d["kind"] == "ConfigMap" and not is_dashboard(d)]
    C.ok("renders exactly one Deployment and one zkq.toml ConfigMap", len(deployments) == 1 and len(configmaps) == 1, str(kinds))
    C.ok("renders no Secret (credentials are referenced, never rendered)", "Secret" not in kinds)
    if len(deployments) != 1 or len(configmaps) != 1:
        return {}
    dep, cm = deployments[0], configmaps[0]
    pod = dep["spec"]["template"]["spec"]
    init = pod.get("initContainers") or []
    containers = pod.get("containers") or []
    name = zkq_values["containerName"]
    in_init = [c for c in init if c["name"] == name]
    in_main = [c for c in containers if c["name"] == name]
    if native:
        C.ok(
            "native sidecar: zkq is in initContainers with restartPolicy: Always, not in containers",
            len(in_init) == 1 and in_init[0].get("restartPolicy") == "Always" and not in_main,
        )
    else:
        C.ok(
            "plain container: zkq is in containers without restartPolicy, and there are no initContainers",
            len(in_main) == 1 and "restartPolicy" not in in_main[0] and not in_init and "initContainers" not in pod,
        )
    zkq_c = (in_init or in_main or [{}])[0]
    app = next((c for c in containers if c["name"] == "app"), {})

    toml_text = cm["data"]["zkq.toml"]
    (outdir / "zkq.toml").write_text(toml_text)
    try:
        toml = tomllib.loads(toml_text)
        C.ok("ConfigMap zkq.toml is valid TOML", True)
    except tomllib.TOMLDecodeError as e:
        C.ok("ConfigMap zkq.toml is valid TOML", False, str(e))
        return {}
    # What the template writes: every key, a queue's kind defaults to fifo, a counter's seed to 0,
    # and an empty queues/counters table is left out.
    expected_config = copy.deepcopy(zkq_values["config"])
    for q in expected_config.get("queues", {}).values():
        q.setdefault("kind", "fifo")
    for c in expected_config.get("counters", {}).values():
        c.setdefault("seed", 0)
    for table in ("queues", "counters"):
        if not expected_config.get(table):
            expected_config.pop(table, None)
    # Secrets reach zkq as files: the chart writes their paths (and an empty ACL list or SASL
    # table is left out).
    zk_expected = expected_config["zookeeper"]
    if not zk_expected.get("acl"):
        zk_expected.pop("acl", None)
    if zkq_values["tlsSecret"]["name"]:
        zk_expected["tls"]["ca_file"] = f"{SECRETS_DIR}/tls/ca.crt"
        if zkq_values["tlsSecret"]["certKey"]:
            zk_expected["tls"]["cert_file"] = f"{SECRETS_DIR}/tls/tls.crt"
            zk_expected["tls"]["key_file"] = f"{SECRETS_DIR}/tls/tls.key"
    if zk_expected["sasl"]["mechanism"]:
        zk_expected["sasl"]["password_file"] = f"{SECRETS_DIR}/sasl/password"
    else:
        zk_expected.pop("sasl")
    if zkq_values["apiTokenSecret"]["name"]:
        expected_config["api"]["token_file"] = f"{SECRETS_DIR}/api-token/token"
    if zkq_values["sqsSecret"]["name"]:
        expected_config.setdefault("sqs", {})["secret_access_key_file"] = f"{SECRETS_DIR}/sqs/secret-access-key"
    C.ok(
        "zkq.toml holds exactly the configured values (every key, types intact)",
        toml == expected_config,
        f"toml={toml}\nvalues={expected_config}",
    )
    grace = grace_seconds(toml["shutdown"]["grace"])
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    C.ok(f"terminationGracePeriodSeconds ({tgps}) > shutdown.grace ({grace}s)", tgps > grace)

    api_port = int(toml["api"]["listen"].rsplit(":", 1)[1])
    admin_port = int(toml["admin"]["listen"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in zkq_c.get("ports", [])}
    C.ok(f"ports zkq-api={api_port}, zkq-admin={admin_port} (from the listen addresses)",
         ports == {"zkq-api": api_port, "zkq-admin": admin_port}, str(ports))
    C.ok("args: --config /etc/zkq/zkq.toml", zkq_c.get("args") == ["--config", "/etc/zkq/zkq.toml"])
    image = zkq_values["image"]
    want_image = f"{image['repository']}@{image['digest']}" if image["digest"] else f"{image['repository']}:{image['tag']}"
    C.ok(f"image {want_image}, pullPolicy {image['pullPolicy']}",
         zkq_c.get("image") == want_image and zkq_c.get("imagePullPolicy") == image["pullPolicy"])

    def probe(kind: str) -> tuple[Any, Any]:
        p = zkq_c.get(kind, {}).get("httpGet", {})
        return p.get("path"), p.get("port")

    C.ok(
        "startupProbe and readinessProbe GET /readyz, livenessProbe GET /livez, on zkq-admin",
        probe("startupProbe") == ("/readyz", "zkq-admin")
        and probe("readinessProbe") == ("/readyz", "zkq-admin")
        and probe("livenessProbe") == ("/livez", "zkq-admin"),
    )
    resources = zkq_c.get("resources", {})
    C.ok(
        "resources: cpu+memory requests and a memory limit",
        {"cpu", "memory"} <= set(resources.get("requests", {})) and "memory" in resources.get("limits", {}),
        str(resources),
    )
    sc = zkq_c.get("securityContext", {})
    pod_sc = pod.get("securityContext", {})
    C.ok(
        "zkq securityContext: runAsNonRoot, readOnlyRootFilesystem, no privilege escalation, drop ALL, seccomp RuntimeDefault",
        sc.get("runAsNonRoot") is True
        and sc.get("readOnlyRootFilesystem") is True
        and sc.get("allowPrivilegeEscalation") is False
        and "ALL" in sc.get("capabilities", {}).get("drop", [])
        and sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
        str(sc),
    )
    C.ok(
        "pod securityContext: runAsNonRoot with a numeric user, seccomp RuntimeDefault",
        pod_sc.get("runAsNonRoot") is True
        and isinstance(pod_sc.get("runAsUser"), int)
        and pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
        str(pod_sc),
    )
    app_sc = app.get("securityContext", {})
    C.ok(
        "app securityContext: readOnlyRootFilesystem, no privilege escalation, drop ALL",
        app_sc.get("readOnlyRootFilesystem") is True
        and app_sc.get("allowPrivilegeEscalation") is False
        and "ALL" in app_sc.get("capabilities", {}).get("drop", []),
    )
    mounts = {m["mountPath"]: m for m in zkq_c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    vol = volumes.get(mounts.get("/etc/zkq", {}).get("name", "?"), {})
    C.ok(
        "/etc/zkq is mounted read-only from the rendered ConfigMap",
        mounts.get("/etc/zkq", {}).get("readOnly") is True
        and vol.get("configMap", {}).get("name") == cm["metadata"]["name"],
    )
    want_cm = zkq_values["configMapName"] or f"{RELEASE}-zkq"
    C.ok(f"ConfigMap name {want_cm}", cm["metadata"]["name"] == want_cm)
    labels = cm["metadata"].get("labels", {})
    C.ok(
        "ConfigMap labels app.kubernetes.io/{" + ",".join(SIX_LABELS) + "}",
        all(labels.get(f"app.kubernetes.io/{k}") for k in SIX_LABELS)
        and labels["app.kubernetes.io/name"] == "zkq"
        and labels["app.kubernetes.io/instance"] == RELEASE,
        str(labels),
    )
    pod_labels = dep["spec"]["template"]["metadata"].get("labels", {})
    C.ok("pod labels app.kubernetes.io/{" + ",".join(SIX_LABELS) + "}",
         all(pod_labels.get(f"app.kubernetes.io/{k}") for k in SIX_LABELS), str(pod_labels))

    # Secrets: never in a ConfigMap; the credential reaches zkq only through secretKeyRef.
    env = {e["name"]: e for e in zkq_c.get("env", [])}
    auth = zkq_values["authSecret"]
    all_cm_text = "\n".join(json.dumps(d.get("data", {})) for _, d in docs if d["kind"] == "ConfigMap")
    C.ok("no ConfigMap mentions auth_digest or holds a user:password value",
         "auth_digest =" not in all_cm_text and "auth_digest\"" not in all_cm_text)
    C.ok("no ConfigMap holds a SASL password or a token (only file paths)",
         "password =" not in all_cm_text and "token =" not in all_cm_text)
    if auth["name"]:
        ref = env.get("ZKQ__ZOOKEEPER__AUTH_DIGEST", {})
        C.ok(
            f"ZKQ__ZOOKEEPER__AUTH_DIGEST from secretKeyRef {auth['name']}/{auth['key']} (no literal value)",
            "value" not in ref
            and ref.get("valueFrom", {}).get("secretKeyRef", {}) == {"name": auth["name"], "key": auth["key"]},
            str(ref),
        )
    else:
        C.ok("no ZKQ__ZOOKEEPER__AUTH_DIGEST without zkq.authSecret.name", "ZKQ__ZOOKEEPER__AUTH_DIGEST" not in env)
    for extra in zkq_values["extraEnv"]:
        C.ok(f"extraEnv {extra['name']} passed through", env.get(extra["name"]) == extra)

    # Secret files: each configured Secret is a volume projecting only its keys under fixed names,
    # mounted read-only in the zkq container where zkq.toml points.
    secret_files = [
        ("zkq-tls", f"{SECRETS_DIR}/tls", zkq_values["tlsSecret"]["name"],
         [(zkq_values["tlsSecret"]["caKey"], "ca.crt")]
         + ([(zkq_values["tlsSecret"]["certKey"], "tls.crt"), (zkq_values["tlsSecret"]["keyKey"], "tls.key")]
            if zkq_values["tlsSecret"]["certKey"] else [])),
        ("zkq-sasl", f"{SECRETS_DIR}/sasl", zkq_values["saslSecret"]["name"],
         [(zkq_values["saslSecret"]["key"], "password")]),
        ("zkq-api-token", f"{SECRETS_DIR}/api-token", zkq_values["apiTokenSecret"]["name"],
         [(zkq_values["apiTokenSecret"]["key"], "token")]),
        ("zkq-sqs", f"{SECRETS_DIR}/sqs", zkq_values["sqsSecret"]["name"],
         [(zkq_values["sqsSecret"]["key"], "secret-access-key")]),
    ]
    for volume, mount_path, secret, items in secret_files:
        if not secret:
            C.ok(f"no {volume} volume or mount without its Secret", volume not in volumes
                 and all(m["name"] != volume for m in zkq_c.get("volumeMounts", [])))
            continue
        mount = mounts.get(mount_path, {})
        C.ok(
            f"{volume}: Secret {secret} keys {[k for k, _ in items]} as {[p for _, p in items]}, mounted read-only at {mount_path}",
            volumes.get(volume, {}).get("secret", {}) == {
                "secretName": secret,
                "items": [{"key": k, "path": p} for k, p in items],
            }
            and mount.get("name") == volume
            and mount.get("readOnly") is True,
            f"volume={volumes.get(volume)} mount={mount}",
        )
    paths = [toml["zookeeper"].get("tls", {}).get(k) for k in ("ca_file", "cert_file", "key_file")]
    paths += [toml["zookeeper"].get("sasl", {}).get("password_file"), toml["api"].get("token_file")]
    paths += [toml.get("sqs", {}).get("secret_access_key_file")]
    mounted = {f"{m['mountPath']}/" for m in zkq_c.get("volumeMounts", [])}
    C.ok(
        "every file zkq.toml names lies in a volume mounted in the zkq container",
        all(any(p.startswith(d) for d in mounted) for p in paths if p),
        f"paths={paths} mounts={sorted(mounted)}",
    )
    if zkq_values["apiTokenSecret"]["name"]:
        app_mounts = {m["mountPath"]: m for m in app.get("volumeMounts", [])}
        token_env = {e["name"]: e.get("value") for e in app.get("env", [])}.get("ZKQ_API_TOKEN_FILE")
        C.ok(
            "the app mounts zkq-api-token read-only and reads the token from where zkq does",
            app_mounts.get(f"{SECRETS_DIR}/api-token", {}).get("name") == "zkq-api-token"
            and token_env == toml["api"].get("token_file"),
            f"mounts={app_mounts} env={token_env}",
        )

    app_env = {e["name"]: e.get("value") for e in app.get("env", [])}
    api_host = toml["api"]["listen"].rsplit(":", 1)[0]
    url_host = "127.0.0.1" if api_host in ("0.0.0.0", "[::]") else api_host
    C.ok(f"the app reaches zkq at http://{url_host}:{api_port}", app_env.get("ZKQ_URL") == f"http://{url_host}:{api_port}",
         str(app_env))

    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    C.ok("pod annotation checksum/zkq-config present", bool(annotations.get("checksum/zkq-config")))
    if zkq_values["metrics"]["annotations"]:
        C.ok(
            f"prometheus.io/scrape=true, port={admin_port}, path=/metrics",
            annotations.get("prometheus.io/scrape") == "true"
            and annotations.get("prometheus.io/port") == str(admin_port)
            and annotations.get("prometheus.io/path") == "/metrics",
            str(annotations),
        )
    else:
        C.ok("no prometheus.io annotations (zkq.metrics.annotations=false)",
             not any(k.startswith("prometheus.io/") for k in annotations))
    if zkq_values["podMonitor"]["enabled"]:
        pm = pod_monitors[0] if pod_monitors else {}
        ep = (pm.get("spec", {}).get("podMetricsEndpoints") or [{}])[0]
        C.ok(
            "PodMonitor scrapes port zkq-admin /metrics, selects this release's pods, carries the extra labels",
            len(pod_monitors) == 1
            and ep.get("port") == "zkq-admin"
            and ep.get("path") == "/metrics"
            and ep.get("interval") == zkq_values["podMonitor"]["interval"]
            and pm["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/instance": RELEASE}}
            and all(pm["metadata"]["labels"].get(k) == v for k, v in zkq_values["podMonitor"]["labels"].items())
            and all(pod_labels.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items()),
            str(pm),
        )
    else:
        C.ok("no PodMonitor (zkq.podMonitor.enabled=false)", not pod_monitors)

    # The real binary accepts the rendered file, with the environment the pod gives it.
    if zkq_bin is not None:
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("ZKQ__")}
        sentinel = "zkq-check-user:s3cret-sentinel-value"
        if auth["name"]:
            clean_env["ZKQ__ZOOKEEPER__AUTH_DIGEST"] = sentinel
        # The Secrets' files exist only in the pod: check the configuration without reading them.
        files = [p for p in paths if p]
        no_files = ["--no-files"] if files else []
        res = run([str(zkq_bin), "check-config", *no_files, "--config", str(outdir / "zkq.toml")], env=clean_env)
        (outdir / "check-config.txt").write_text(res.stdout + res.stderr)
        C.ok(
            f"zkq check-config {' '.join(no_files + [''])}--config {outdir.relative_to(ROOT)}/zkq.toml"
            + (" (with ZKQ__ZOOKEEPER__AUTH_DIGEST set as the Secret would)" if auth["name"] else ""),
            res.returncode == 0,
            f"exit {res.returncode}: {(res.stdout + res.stderr).strip()}",
        )
        if files:
            reads = run([str(zkq_bin), "check-config", "--config", str(outdir / "zkq.toml")], env=clean_env)
            C.ok(
                "without --no-files, zkq check-config reads the files and refuses the missing ones (exit 64)",
                reads.returncode == 64 and any(p in reads.stderr for p in files),
                f"exit {reads.returncode}: {reads.stderr.strip()}",
            )
        if res.returncode == 0:
            effective = tomllib.loads(res.stdout.split("\n", 1)[1])
            C.ok(
                "zkq's effective configuration equals the chart's values (connect, root, listens, grace, queues, counters)",
                effective["zookeeper"]["connect"] == toml["zookeeper"]["connect"]
                and effective["zookeeper"]["root"] == toml["zookeeper"]["root"]
                and effective["api"]["listen"] == toml["api"]["listen"]
                and effective["admin"]["listen"] == toml["admin"]["listen"]
                and effective["shutdown"]["grace"] == toml["shutdown"]["grace"]
                and set(effective.get("queues", {})) == set(toml.get("queues", {}))
                and set(effective.get("counters", {})) == set(toml.get("counters", {})),
                res.stdout,
            )
            C.ok(
                "zkq's effective TLS, SASL, ACL and API token settings equal the chart's",
                all(effective["zookeeper"]["tls"].get(k) == v for k, v in toml["zookeeper"]["tls"].items())
                and {k: v for k, v in effective["zookeeper"].get("sasl", {}).items() if k != "password"}
                == toml["zookeeper"].get("sasl", {})
                and effective["zookeeper"].get("acl") == toml["zookeeper"].get("acl")
                and effective["api"].get("token_file") == toml["api"].get("token_file")
                and effective["api"]["refuse_cross_origin"] == toml["api"]["refuse_cross_origin"],
                res.stdout,
            )
            pushed = {n: q["push"] for n, q in toml.get("queues", {}).items() if "push" in q}
            if pushed:
                C.ok(
                    f"zkq reads the push subscriptions as written ({', '.join(sorted(pushed))})",
                    all(
                        all(effective["queues"][n]["push"].get(k) == v for k, v in p.items()
                            if k not in ("visibility", "request_timeout", "backoff_initial", "backoff_max",
                                         "readiness_interval"))
                        for n, p in pushed.items()
                    ),
                    res.stdout,
                )
            if auth["name"]:
                C.ok(
                    "the credential from the environment is used and redacted in zkq's output",
                    sentinel not in res.stdout + res.stderr
                    and effective["zookeeper"].get("auth_digest") == "<redacted>",
                )
    return annotations


def yamllint_long_lines() -> str:
    """The rendered-manifest yamllint rules without the line-length rule."""
    rules = load_yaml(DEPLOY / "yamllint.yaml")
    rules["rules"]["line-length"] = "disable"
    return json.dumps(rules)


def promtool() -> str | None:
    return shutil.which("promtool")


def promtool_check_groups(groups: dict[str, Any], path: Path) -> subprocess.CompletedProcess[str] | None:
    """`promtool check rules` on `groups` written as a rules file at `path`."""
    path.write_text(yaml.safe_dump(groups, sort_keys=False, width=1000))
    tool = promtool()
    return run([tool, "check", "rules", str(path)]) if tool else None


def check_monitoring_objects(docs: list[tuple[str, dict[str, Any]]], zkq_values: dict[str, Any], outdir: Path,
                             venv_bin: Path, is_dashboard: Callable[[dict[str, Any]], bool]) -> None:
    """The PrometheusRule and the dashboard ConfigMap of one rendering, when enabled."""
    rule_objects = [d for _, d in docs if d["kind"] == "PrometheusRule"]
    settings = zkq_values["prometheusRule"]
    if not settings["enabled"]:
        C.ok("no PrometheusRule (zkq.prometheusRule.enabled=false)", not rule_objects)
    else:
        pr = rule_objects[0] if rule_objects else {}
        C.ok(
            "one PrometheusRule carrying the chart's labels and zkq.prometheusRule.labels",
            len(rule_objects) == 1
            and pr["metadata"]["labels"].get("app.kubernetes.io/name") == "zkq"
            and all(pr["metadata"]["labels"].get(k) == v for k, v in settings["labels"].items()),
            str(pr.get("metadata")),
        )
        spec = pr.get("spec", {})
        res = promtool_check_groups(spec, outdir / "prometheusrule-spec.yaml")
        C.ok("promtool check rules on the PrometheusRule's spec", res is not None and res.returncode == 0,
             "promtool missing (Debian's prometheus package)" if res is None else (res.stdout + res.stderr).strip())
        rules = [r for g in spec.get("groups", []) for r in g.get("rules", [])]
        wanted = {ALERTS[k] for k, a in settings["alerts"].items() if a["enabled"]}
        C.ok(f"exactly the enabled alerts ({len(wanted)})", {r["alert"] for r in rules} == wanted,
             str(sorted(r["alert"] for r in rules)))
        selector = settings["selector"]
        C.ok(
            f"every selector of every rule carries zkq.prometheusRule.selector ({selector or 'none'})",
            all(expr_selectors_carry(r["expr"], selector) for r in rules),
            "\n".join(r["expr"] for r in rules),
        )
        alerts = settings["alerts"]
        by_name = {r["alert"]: r for r in rules}
        backlog = by_name.get("ZkqQueueBacklogGrowing")
        if backlog:
            C.ok(
                f"thresholds come from values (backlog > {alerts['backlogGrowing']['minDepth']} over "
                f"{alerts['backlogGrowing']['window']}, for {alerts['backlogGrowing']['for']})",
                f"> {alerts['backlogGrowing']['minDepth']}\n" in backlog["expr"]
                and f"[{alerts['backlogGrowing']['window']}]" in backlog["expr"]
                and backlog["for"] == alerts["backlogGrowing"]["for"],
                backlog["expr"],
            )
        C.ok(
            "every alert: severity and zkq.prometheusRule.alertLabels, runbook_url = runbookUrl#<alert>",
            all(
                r["labels"].get("severity")
                and all(r["labels"].get(k) == v for k, v in settings["alertLabels"].items())
                and r["annotations"]["runbook_url"] == f"{settings['runbookUrl']}#{r['alert'].lower()}"
                for r in rules
            ),
        )
    dashboards = [d for _, d in docs if is_dashboard(d)]
    if not zkq_values["dashboard"]["enabled"]:
        C.ok("no dashboard ConfigMap (zkq.dashboard.enabled=false)", not dashboards)
        return
    res = run([str(venv_bin / "kubernetes-validate"), "--strict", "-k", KUBE_VERSION, str(outdir / "dashboard.yaml")])
    C.ok(f"dashboard ConfigMap valid for Kubernetes {KUBE_VERSION} (strict)",
         res.returncode == 0 and res.stdout.count("passed") == 1, (res.stdout + res.stderr).strip())
    cm = dashboards[0] if dashboards else {}
    labels = cm.get("metadata", {}).get("labels", {})
    try:
        shipped = json.loads(cm.get("data", {}).get("zkq.json", ""))
    except json.JSONDecodeError as e:
        shipped = {"error": str(e)}
    C.ok(
        "one dashboard ConfigMap labelled for Grafana's sidecar (zkq.dashboard.labels), holding helm/monitoring/zkq-dashboard.json",
        len(dashboards) == 1
        and all(labels.get(k) == v for k, v in zkq_values["dashboard"]["labels"].items())
        and all(cm["metadata"].get("annotations", {}).get(k) == v for k, v in zkq_values["dashboard"]["annotations"].items())
        and shipped == json.loads((MONITORING / "zkq-dashboard.json").read_text()),
        str(cm.get("metadata")),
    )


# The chart's alert keys and the alerts they render.
ALERTS = {
    "backlogGrowing": "ZkqQueueBacklogGrowing",
    "oldestMessage": "ZkqOldestMessageTooOld",
    "leasesExpiring": "ZkqLeasesExpiring",
    "deadLetters": "ZkqDeadLettersArriving",
    "claimConflicts": "ZkqClaimConflictsHigh",
    "childListLarge": "ZkqChildListTooLarge",
    "putsFailing": "ZkqPutsFailing",
    "sessionLost": "ZkqZookeeperSessionLost",
    "disconnected": "ZkqZookeeperDisconnected",
    "notReady": "ZkqNotReady",
}


def expr_selectors_carry(expr: str, selector: str) -> bool:
    """Whether every zkq_* selector in `expr` holds `selector` (an empty selector: trivially)."""
    if not selector:
        return True
    # Label values may hold braces (route="/v1/queues/{queue}/messages"): match quoted strings whole.
    selectors = re.findall(r'\bzkq_[a-z_]+(\{(?:[^}"]|"[^"]*")*\})?', expr)
    return bool(selectors) and all(selector in sel for sel in selectors)


def check_monitoring(venv_bin: Path) -> None:
    """The plain rules file, its promtool tests, the dashboard file and the runbook they link to."""
    C.section("monitoring: helm/monitoring (rules, their tests, the dashboard) and docs/operations.md")
    C.ok(
        "helm/zkq-sidecar/templates/_dashboard.tpl holds helm/monitoring/zkq-dashboard.json",
        DASHBOARD_TPL.exists() and DASHBOARD_TPL.read_text() == dashboard_template(),
        "run scripts/check-deploy.sh --sync",
    )
    file_json = json.loads((MONITORING / "zkq-dashboard.json").read_text())
    rendered_json = json.loads(probe_render('{{ include "zkq-sidecar.dashboardJson" . }}\n'))
    C.ok("the library renders the dashboard JSON unchanged ({{label}} legends included)", rendered_json == file_json)
    rules_path = MONITORING / "zkq-alerts.yaml"
    C.ok(
        "helm/monitoring/zkq-alerts.yaml == the library's rules rendered with the chart's default thresholds",
        rules_path.read_text() == plain_rules(),
        "run scripts/check-deploy.sh --sync",
    )
    tool = promtool()
    if not C.ok("promtool is installed (Debian's prometheus package)", tool is not None):
        return
    res = run([tool, "check", "rules", str(rules_path)])
    C.ok("promtool check rules helm/monitoring/zkq-alerts.yaml", res.returncode == 0, (res.stdout + res.stderr).strip())
    tests_path = MONITORING / "zkq-alerts.test.yaml"
    res = run([tool, "test", "rules", str(tests_path)])
    C.ok("promtool test rules helm/monitoring/zkq-alerts.test.yaml", res.returncode == 0, (res.stdout + res.stderr).strip())
    rules = [r for g in load_yaml(rules_path)["groups"] for r in g["rules"]]
    alerts = {r["alert"] for r in rules}
    C.ok(f"the rules file holds every alert the chart knows ({len(ALERTS)})", alerts == set(ALERTS.values()), str(sorted(alerts)))
    cases = [t for test in load_yaml(tests_path)["tests"] for t in test.get("alert_rule_test", [])]
    fires = {t["alertname"] for t in cases if t.get("exp_alerts")}
    quiet = {t["alertname"] for t in cases if t.get("exp_alerts") == []}
    C.ok("every alert has a unit test where it fires and one where it does not",
         alerts <= fires and alerts <= quiet, f"no firing test: {sorted(alerts - fires)}; no quiet test: {sorted(alerts - quiet)}")
    runbook = OPERATIONS.read_text() if OPERATIONS.exists() else ""
    anchors = {h.strip().lower() for h in re.findall(r"^### (Zkq\w+)\s*$", runbook, re.M)}
    C.ok(
        "every alert has its section in docs/operations.md (### <alert name>), and its runbook_url points there",
        all(r["alert"].lower() in anchors and r["annotations"]["runbook_url"].endswith("#" + r["alert"].lower()) for r in rules),
        f"sections: {sorted(anchors)}",
    )
    res = run([str(venv_bin / "yamllint"), "-s", "-d", yamllint_long_lines().replace('"present": true', '"present": false'),
               str(rules_path), str(tests_path)])
    C.ok("yamllint (strict, any line length) on the rules file and its tests", res.returncode == 0, (res.stdout + res.stderr).strip())


def check_renders(zkq_bin: Path | None, venv_bin: Path) -> None:
    out = ROOT / "target" / "deploy-check"
    annotations: dict[str, dict[str, str]] = {}
    with helm.Chart.load(DEMO) as chart:
        for values_file in sorted(CI_VALUES.glob("*-values.yaml")):
            case = values_file.name.removesuffix("-values.yaml")
            values = load_yaml(values_file) or {}
            C.section(f"zkq-demo rendered with ci/{values_file.name} (release {RELEASE}, Kubernetes {KUBE_VERSION})")
            try:
                rendered = render(chart, values)
            except helm.HelmError as e:
                C.ok("renders", False, str(e))
                continue
            C.ok("renders", True)
            annotations[case] = check_case(case, values, rendered, out / case, zkq_bin, venv_bin)
        if "default" in annotations and "custom" in annotations:
            C.section("across renderings")
            C.ok(
                "checksum/zkq-config changes with the configuration (a config change rolls the pods)",
                annotations["default"].get("checksum/zkq-config") != annotations["custom"].get("checksum/zkq-config"),
            )

        C.section("misconfigurations the charts refuse")
        refusals: list[tuple[str, dict[str, Any], str, str]] = [
            ("a ZooKeeper password in zkq.config (it would land in the ConfigMap)",
             {"zkq": {"config": {"zookeeper": {"auth_digest": "user:password"}}}}, KUBE_VERSION, "auth_digest"),
            ("a misspelled key (strict schema)",
             {"zkq": {"config": {"zookeeper": {"conect": "zk:2181"}}}}, KUBE_VERSION, "conect"),
            ("an unknown queue kind", {"zkq": {"config": {"queues": {"q": {"kind": "lifo"}}}}}, KUBE_VERSION, "kind"),
            ("a push URL that is not http://",
             {"zkq": {"config": {"queues": {"q": {"push": {"url": "https://app:3000/q"}}}}}}, KUBE_VERSION, "url"),
            ("a push subscription without a URL",
             {"zkq": {"config": {"queues": {"q": {"push": {"concurrency": 2}}}}}}, KUBE_VERSION, "url"),
            ("no ZooKeeper connect string", {"zkq": {"config": {"zookeeper": {"connect": ""}}}}, KUBE_VERSION,
             "zookeeper.connect"),
            ("terminationGracePeriodSeconds not above shutdown.grace",
             {"terminationGracePeriodSeconds": 10, "zkq": {"config": {"shutdown": {"grace": "10s"}}}}, KUBE_VERSION,
             "terminationGracePeriodSeconds"),
            ("an admin listener on loopback (probes and Prometheus could not reach it)",
             {"zkq": {"config": {"admin": {"listen": "127.0.0.1:9090"}}}}, KUBE_VERSION, "loopback"),
            ("the same port for api and admin",
             {"zkq": {"config": {"api": {"listen": "127.0.0.1:9090"}}}}, KUBE_VERSION, "different ports"),
            ("a native sidecar on Kubernetes 1.28", {}, "1.28.0", "nativeSidecar"),
            ("a rule selector that is not PromQL label matchers",
             {"zkq": {"prometheusRule": {"enabled": True, "selector": "namespace=orders"}}}, KUBE_VERSION, "selector"),
            ("TLS without the Secret that holds its CA",
             {"zkq": {"config": {"zookeeper": {"tls": {"enabled": True}}}}}, KUBE_VERSION, "tlsSecret.name"),
            ("a TLS Secret with TLS disabled", {"zkq": {"tlsSecret": {"name": "zk-tls"}}}, KUBE_VERSION,
             "tls.enabled is false"),
            ("a client certificate without its key",
             {"zkq": {"tlsSecret": {"name": "zk-tls", "certKey": "tls.crt"},
                      "config": {"zookeeper": {"tls": {"enabled": True}}}}}, KUBE_VERSION, "keyKey"),
            ("a SASL password in zkq.config (it would land in the ConfigMap)",
             {"zkq": {"config": {"zookeeper": {"sasl": {"password": "x"}}}}}, KUBE_VERSION, "password"),
            ("SASL without the Secret that holds the password",
             {"zkq": {"config": {"zookeeper": {"sasl": {"mechanism": "DIGEST-MD5", "username": "app"}}}}},
             KUBE_VERSION, "saslSecret.name"),
            ("an unknown SASL mechanism",
             {"zkq": {"config": {"zookeeper": {"sasl": {"mechanism": "GSSAPI"}}}}}, KUBE_VERSION, "mechanism"),
            ("an API token file path in zkq.config (use zkq.apiTokenSecret)",
             {"zkq": {"config": {"api": {"token_file": "/token"}}}}, KUBE_VERSION, "token_file"),
        ]
        for label, values, kube, needle in refusals:
            try:
                render(chart, values, kube_version=kube)
                C.ok(f"refused: {label}", False, "rendered without error")
            except helm.HelmError as e:
                C.ok(f"refused: {label}", needle in str(e), str(e))
        try:
            render(chart, {"zkq": {"nativeSidecar": False}}, kube_version="1.28.0")
            C.ok("accepted: zkq.nativeSidecar=false on Kubernetes 1.28", True)
        except helm.HelmError as e:
            C.ok("accepted: zkq.nativeSidecar=false on Kubernetes 1.28", False, str(e))

    if zkq_bin is not None:
        C.section("the check-config harness itself")
        bad = out / "unknown-key.toml"
        bad.write_text('[zookeeper]\nconect = "zk:2181"\n')
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("ZKQ__")}
        res = run([str(zkq_bin), "check-config", "--config", str(bad)], env=clean_env)
        C.ok("zkq check-config refuses a TOML with an unknown key (exit 64)", res.returncode == 64,
             f"exit {res.returncode}: {res.stderr.strip()}")


def check_readme_example(venv_bin: Path) -> None:
    """The library README's "three lines", pasted into a minimal chart, render a valid pod."""
    C.section("the library README's three lines, in a minimal chart of their own")
    readme = (LIB / "README.md").read_text()
    snippets = {
        "dependency": "  - name: zkq-sidecar\n    version: 0.1.0\n",
        "container": '      initContainers:\n        {{- include "zkq-sidecar.container" . | nindent 8 }}\n',
        "volumes": '      volumes:\n        {{- include "zkq-sidecar.volumes" . | nindent 8 }}\n',
        "configmap": '{{ include "zkq-sidecar.configmap" . }}\n',
        "annotations": '      annotations:\n        {{- include "zkq-sidecar.podAnnotations" . | nindent 8 }}\n',
    }
    missing = [k for k, v in snippets.items() if v not in readme]
    C.ok("the README shows these snippets verbatim: " + ", ".join(snippets), not missing, f"missing: {missing}")
    chart_dir = ROOT / "target" / "deploy-check" / "readme-example"
    if chart_dir.exists():
        shutil.rmtree(chart_dir)
    (chart_dir / "templates").mkdir(parents=True)
    shutil.copytree(LIB, chart_dir / "charts" / "zkq-sidecar")
    (chart_dir / "Chart.yaml").write_text(
        "apiVersion: v2\nname: my-app\nversion: 1.0.0\ndependencies:\n"
        + snippets["dependency"]
        + "    repository: file://../zkq-sidecar\n"
    )
    (chart_dir / "values.yaml").write_text("zkq:\n  config:\n    zookeeper:\n      connect: zk-0.zk-hs:2181\n")
    (chart_dir / "templates" / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}-app\nspec:\n"
        "  selector:\n    matchLabels:\n      app: my-app\n  template:\n    metadata:\n"
        "      labels:\n        app: my-app\n"
        + snippets["annotations"]
        + "    spec:\n      terminationGracePeriodSeconds: 30\n"
        + snippets["container"]
        + "      containers:\n        - name: app\n          image: registry.example.com/my-app:1.0.0\n"
        + snippets["volumes"]
    )
    (chart_dir / "templates" / "zkq.yaml").write_text(snippets["configmap"])
    with helm.Chart.load(chart_dir) as chart:
        try:
            rendered = render(chart, {})
        except helm.HelmError as e:
            C.ok("renders", False, str(e))
            return
    out = chart_dir / "rendered.yaml"
    out.write_text(manifest_text(rendered, lambda d: True))
    res = run([str(venv_bin / "kubernetes-validate"), "--strict", "-k", KUBE_VERSION, str(out)])
    C.ok(f"renders a Deployment and a ConfigMap valid for Kubernetes {KUBE_VERSION} (strict)",
         res.returncode == 0 and res.stdout.count("passed") == 2, (res.stdout + res.stderr).strip())
    docs = dict((d["kind"], d) for _, d in documents(rendered))
    pod = docs.get("Deployment", {}).get("spec", {}).get("template", {}).get("spec", {})
    init = pod.get("initContainers") or [{}]
    C.ok("zkq is a native sidecar mounting the ConfigMap",
         init[0].get("restartPolicy") == "Always"
         and pod.get("volumes", [{}])[0].get("configMap", {}).get("name") == docs.get("ConfigMap", {}).get("metadata", {}).get("name"))


def check_values_files(venv_bin: Path) -> None:
    C.section("yamllint on the charts' plain YAML files (Chart.yaml, values.yaml, ci/*.yaml)")
    files = [LIB / "Chart.yaml", DEMO / "Chart.yaml", DEMO / "values.yaml", *sorted(CI_VALUES.glob("*.yaml"))]
    # values.yaml/Chart.yaml have no leading '---' by Helm convention.
    res = run([str(venv_bin / "yamllint"), "-s", "-d",
               "{extends: default, rules: {line-length: {max: 120}, document-start: disable, "
               "truthy: {allowed-values: ['true', 'false']}}}", *map(str, files), str(LIB / "values.yaml")])
    C.ok(f"yamllint {len(files) + 1} files", res.returncode == 0, (res.stdout + res.stderr).strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zkq-bin", type=Path, help="zkq binary for check-config (skipped when absent)")
    parser.add_argument("--sync", action="store_true", help="refresh the demo schema's zkq part first")
    args = parser.parse_args()
    venv_bin = Path(sys.executable).parent
    if args.sync:
        sync()
    helm.disable_logging()
    build_dependencies()
    zkq_bin = args.zkq_bin.resolve() if args.zkq_bin else None
    check_consistency()
    check_dockerfile()
    lint_charts()
    check_values_files(venv_bin)
    check_renders(zkq_bin, venv_bin)
    check_monitoring(venv_bin)
    check_readme_example(venv_bin)
    print(f"\ndeploy checks: {C.passed} passed, {len(C.failed)} failed")
    for what in C.failed:
        print(f"  failed: {what}")
    return 1 if C.failed else 0


if __name__ == "__main__":
    sys.exit(main())
