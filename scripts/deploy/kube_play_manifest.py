"""Makes a copy of a rendered zkq-demo manifest that `podman kube play` (podman 4.3) can run.

Used by scripts/check-image.sh. Rewrites only what podman cannot model, and prints one line per
rewrite ("rewrite: ...") so that the check's output says what was played instead of the render:

- a native sidecar (an initContainer with restartPolicy: Always) becomes the first regular container:
  podman runs initContainers to completion before the containers, so the app would never start (the
  sidecar's ordering, ready before the app starts and stopped after it exits, is not modelled);
- the ZooKeeper hosts of zkq's connect string (cluster DNS names) get a hostAliases entry for the
  address of the ZooKeeper container;
- the probes are taken out of the copy: podman turns an httpGet probe into `curl` run inside the
  container (distroless has none) and resolves a named port to 0. They are written to a JSON file,
  with named ports resolved, and the check runs each of them itself against the pod;
- images named in --image-map (e.g. the demo app's curl image) are replaced by local stand-ins;
- kinds other than Deployment and ConfigMap are left out.

    python kube_play_manifest.py RENDERED.yaml OUT.yaml PROBES.json --zk-ip 10.89.0.2 \
        [--image-map curlimages/curl:8.11.1=localhost/stand-in/curl:8.11.1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
KINDS = ("Deployment", "ConfigMap")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rendered", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("probes", type=Path)
    parser.add_argument("--zk-ip", required=True)
    parser.add_argument("--zk-port", default="2181")
    parser.add_argument("--image-map", action="append", default=[])
    args = parser.parse_args()
    images = dict(m.split("=", 1) for m in args.image_map)

    docs = [d for d in yaml.safe_load_all(args.rendered.read_text()) if d]
    kept = [d for d in docs if d.get("kind") in KINDS]
    for d in docs:
        if d.get("kind") not in KINDS:
            print(f"rewrite: left out {d.get('kind')} {d.get('metadata', {}).get('name')} (not a pod or its ConfigMap)")

    connect = ""
    for d in kept:
        if d["kind"] == "ConfigMap" and "zkq.toml" in d.get("data", {}):
            connect = tomllib.loads(d["data"]["zkq.toml"])["zookeeper"]["connect"]
    hosts = []
    for server in connect.split(","):
        host, _, port = server.strip().rpartition(":")
        if port != args.zk_port:
            print(f"zookeeper.connect {connect!r}: port {port}, the ZooKeeper container listens on {args.zk_port}")
            return 1
        if not host.replace(".", "").isdigit() and host not in ("localhost",):
            hosts.append(host)

    probes: list[dict[str, Any]] = []
    deployments = [d for d in kept if d["kind"] == "Deployment"]
    if len(deployments) != 1:
        print(f"expected one Deployment, found {len(deployments)}")
        return 1
    spec = deployments[0]["spec"]["template"]["spec"]

    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    if sidecars:
        spec["initContainers"] = [c for c in spec["initContainers"] if c not in sidecars]
        if not spec["initContainers"]:
            del spec["initContainers"]
        for c in sidecars:
            del c["restartPolicy"]
        spec["containers"] = sidecars + spec["containers"]
        names = ", ".join(c["name"] for c in sidecars)
        print(f"rewrite: native sidecar {names} (initContainer, restartPolicy: Always) -> first regular container"
              " (podman starts and stops a pod's containers together: the sidecar's ordering is not modelled)")

    if hosts:
        spec.setdefault("hostAliases", []).append({"ip": args.zk_ip, "hostnames": hosts})
        print(f"rewrite: hostAliases {', '.join(hosts)} -> {args.zk_ip} (the ZooKeeper container; no cluster DNS)")

    for c in spec["containers"] + spec.get("initContainers", []):
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
        for kind in PROBES:
            probe = c.pop(kind, None)
            if probe is None:
                continue
            get = probe.get("httpGet")
            if get is None:
                print(f"container {c['name']}: {kind} is not httpGet, which this check cannot run")
                return 1
            port = get["port"]
            probes.append({
                "container": c["name"],
                "kind": kind,
                "path": get["path"],
                "port": ports[port] if isinstance(port, str) else port,
                "port_name": port if isinstance(port, str) else "",
                "period": probe.get("periodSeconds", 10),
                "timeout": probe.get("timeoutSeconds", 1),
                "failures": probe.get("failureThreshold", 3),
            })
            print(f"rewrite: {c['name']} {kind} taken out (the check runs GET :{probes[-1]['port']}{get['path']} itself)")
        if c["image"] in images:
            print(f"rewrite: {c['name']} image {c['image']} -> {images[c['image']]} (local stand-in)")
            c["image"] = images[c["image"]]

    args.out.write_text(yaml.safe_dump_all(kept, sort_keys=False))
    args.probes.write_text(json.dumps(probes, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
