"""The Kubernetes manifests of deploy/k8s/: every document is validated (core kinds field by field
against the `kubernetes` client's models, the RayCluster and JobSet CRDs against a small hand-written
schema of the fields used here, pod templates inside them against the models again), and every pod
of every job is rendered with the environment Kubernetes would give it (the Job controller's
JOB_COMPLETION_INDEX, the KubeRay TPU webhook's TPU_WORKER_*), then fed to
`slicetrain launch --dry-run`, whose host layout and ranks must be the right ones.
No CRD schema is downloaded: the CRD schemas below state only what these manifests rely on.
"""

import glob
import json
import os
import string
import subprocess
from typing import Dict, List

import jsonschema
import pytest
import yaml
from kubernetes.client import models

from conftest import DEPLOY
from slicetrain_ray import adapter

K8S = os.path.join(DEPLOY, "k8s")
PLACEHOLDERS = {
    "IMAGE_URI": "europe-docker.pkg.dev/p/r/slicetrain:1",
    "IMAGE_URI_RAY": "europe-docker.pkg.dev/p/r/slicetrain-ray:1",
    "IMAGE_URI_CUDA": "europe-docker.pkg.dev/p/r/slicetrain-cuda:1",
    "IMAGE_URI_CUDA_RAY": "europe-docker.pkg.dev/p/r/slicetrain-cuda-ray:1",
    "BUCKET_NAME": "p-slicetrain",
}
# What each RayCluster is for: the command of docs/deploy.md's `ray job submit`.
RAY_COMMANDS = {
    "raycluster-tpu-v6e.yaml": ["finetune", "--topology", "4x4", "--accelerator-type", "TPU-V6E"],
    "raycluster-tpu7x.yaml": ["finetune", "--topology", "2x2x2", "--accelerator-type", "TPU-V7X"],
    "raycluster-gpu.yaml": ["finetune", "--topology", "2x8", "--accelerator-type", "GPU-H100"],
}
# TORCH_TPU_TOPOLOGY as the KubeRay TPU webhook sets it (values from the seed's pods).
TORCH_TPU_TOPOLOGY = {"4x4": "4,4,1", "2x2x2": "2,2,2,2"}
# slicetrain's slices: topology -> (hosts, workers per host); docs/runtime.md's table.
SLICES = {("TPU-V6E", "4x4"): (4, 4), ("TPU-V7X", "2x2x2"): (2, 8), ("GPU-H100", "2x8"): (2, 8)}


def manifest_files() -> List[str]:
    files = sorted(glob.glob(os.path.join(K8S, "*.yaml")))
    assert files, "no manifests under deploy/k8s"
    return files


def render(path: str) -> List[dict]:
    """envsubst, as the docs apply them; an unknown ${VAR} is an error."""
    with open(path) as f:
        text = string.Template(f.read()).substitute(PLACEHOLDERS)
    return [d for d in yaml.safe_load_all(text) if d is not None]


# ---- core kinds: field-by-field against the kubernetes client's models ----------------------------

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def check_model(data, type_name: str, path: str) -> None:
    """Rejects unknown fields and wrong primitive types (what `kubectl apply --validate=strict`
    rejects); required fields are checked by deserialize() below."""
    if type_name.startswith("Optional["):
        check_model(data, type_name[9:-1], path)
    elif type_name.startswith(("List[", "list[")):
        assert isinstance(data, list), f"{path}: expected a list"
        for i, x in enumerate(data):
            check_model(x, type_name[5:-1], f"{path}[{i}]")
    elif type_name.startswith(("Dict[", "dict(")):
        assert isinstance(data, dict), f"{path}: expected a map"
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        for k, v in data.items():
            check_model(v, inner, f"{path}.{k}")
    elif type_name in PRIMITIVES:
        ok = isinstance(data, PRIMITIVES[type_name]) and not (type_name == "int" and isinstance(data, bool))
        assert ok, f"{path}: {data!r} is not a {type_name}"
    elif type_name in ("object", "datetime", "date"):
        pass  # IntOrString, Quantity-like and times
    else:
        klass = getattr(models, type_name)
        assert isinstance(data, dict), f"{path}: expected a {type_name} object"
        by_json = {j: a for a, j in klass.attribute_map.items()}
        unknown = sorted(set(data) - set(by_json))
        assert not unknown, f"{path}: unknown field(s) {unknown} in {type_name}"
        for key, value in data.items():
            check_model(value, klass.openapi_types[by_json[key]], f"{path}.{key}")


def deserialize(doc: dict, type_name: str):
    """The client's own model (pydantic): rejects missing required fields and wrong types."""
    return getattr(models, type_name).from_dict(doc)


CORE_KINDS = {
    ("v1", "Service"): "V1Service",
    ("batch/v1", "Job"): "V1Job",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Secret"): "V1Secret",
}

# ---- CRDs: hand-written schemas of the fields these manifests use ---------------------------------

STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
RAYCLUSTER_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["headGroupSpec", "workerGroupSpecs"],
            "properties": {
                "rayVersion": {"type": "string"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "headGroupSpec": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["rayStartParams", "template"],
                    "properties": {
                        "rayStartParams": STR_MAP,
                        "serviceType": {"type": "string"},
                        "template": {"type": "object"},
                    },
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["groupName", "template"],
                        "properties": {
                            "groupName": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                            "replicas": {"type": "integer", "minimum": 0},
                            "minReplicas": {"type": "integer", "minimum": 0},
                            "maxReplicas": {"type": "integer", "minimum": 0},
                            "numOfHosts": {"type": "integer", "minimum": 1},
                            "rayStartParams": STR_MAP,
                            "resources": STR_MAP,
                            "template": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}
JOBSET_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "annotations": STR_MAP},
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["replicatedJobs"],
            "properties": {
                "failurePolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"maxRestarts": {"type": "integer", "minimum": 0}},
                },
                "network": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "enableDNSHostnames": {"type": "boolean"},
                        "subdomain": {"type": "string"},
                        "publishNotReadyAddresses": {"type": "boolean"},
                    },
                },
                "replicatedJobs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "template"],
                        "properties": {
                            "name": {"type": "string"},
                            "replicas": {"type": "integer", "minimum": 1},
                            "template": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}


def validate(doc: dict, where: str) -> None:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CORE_KINDS:
        check_model(doc, CORE_KINDS[key], where)
        deserialize(doc, CORE_KINDS[key])
    elif key == ("ray.io/v1", "RayCluster"):
        jsonschema.validate(doc, RAYCLUSTER_SCHEMA)
        groups = [doc["spec"]["headGroupSpec"]] + doc["spec"]["workerGroupSpecs"]
        for i, g in enumerate(groups):
            check_model(g["template"], "V1PodTemplateSpec", f"{where}.group[{i}].template")
            deserialize(g["template"], "V1PodTemplateSpec")
    elif key == ("jobset.x-k8s.io/v1alpha2", "JobSet"):
        jsonschema.validate(doc, JOBSET_SCHEMA)
        for i, rj in enumerate(doc["spec"]["replicatedJobs"]):
            check_model(rj["template"], "V1JobTemplateSpec", f"{where}.replicatedJobs[{i}].template")
            deserialize(rj["template"], "V1JobTemplateSpec")
    else:
        pytest.fail(f"{where}: no validator for {key}")


@pytest.mark.parametrize("path", manifest_files(), ids=os.path.basename)
def test_manifest_is_valid(path):
    for i, doc in enumerate(render(path)):
        validate(doc, f"{os.path.basename(path)}#{i}")


def test_validation_catches_mistakes():
    job = render(os.path.join(K8S, "indexed-job-tpu-v6e.yaml"))[1]
    bad = json.loads(json.dumps(job))
    bad["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []  # typo
    with pytest.raises(AssertionError, match="enviroment"):
        validate(bad, "bad")
    bad = json.loads(json.dumps(job))
    bad["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"] = 29500  # unquoted
    with pytest.raises(AssertionError, match="is not a str"):
        validate(bad, "bad")
    bad = json.loads(json.dumps(job))
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(ValueError):
        validate(bad, "bad")
    ray = render(os.path.join(K8S, "raycluster-tpu-v6e.yaml"))[0]
    bad = json.loads(json.dumps(ray))
    bad["spec"]["workerGroupSpecs"][0]["numOfHost"] = 4
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, "bad")
    bad = json.loads(json.dumps(ray))
    bad["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # must be a string
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, "bad")


# ---- pods: the environment Kubernetes gives them, fed to slicetrain's detection -------------------


def container_env(container: dict, pod_ip: str) -> Dict[str, str]:
    """The container's env as the kubelet resolves it (secrets get a stand-in value)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = f"secret-{e['valueFrom']['secretKeyRef']['key']}"
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[e["name"]] = pod_ip
        else:
            pytest.fail(f"cannot resolve env {e}")
    return env


def dry_run(slicetrain_bin: str, args: List[str], env: Dict[str, str]) -> dict:
    """`slicetrain <args>` with --dry-run after `launch`, in exactly `env` (plus PATH)."""
    assert args[0] == "launch", args
    argv = [slicetrain_bin, "launch", "--dry-run", *args[1:]]
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    p = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"{argv} in {env}: {p.stderr}"
    return json.loads(p.stdout)


def flag(args: List[str], name: str) -> str:
    value = adapter.slicetrain_flag(args, name)
    assert value is not None, f"{name} missing in {args}"
    return value


def indexed_jobs():
    """(file, job name, pod hostname fn, completions, pod spec) of every Indexed Job, JobSets too."""
    out = []
    for path in manifest_files():
        docs = render(path)
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        for d in docs:
            if d["kind"] == "Job":
                spec = d["spec"]
                pod = spec["template"]["spec"]
                svc = services[pod["subdomain"]]
                assert svc["spec"]["clusterIP"] == "None", "the Service must be headless"
                assert svc["spec"]["selector"] == {"job-name": d["metadata"]["name"]}
                name = d["metadata"]["name"]
                out.append((path, spec, pod, lambda i, n=name, s=pod["subdomain"]: f"{n}-{i}.{s}"))
            elif d["kind"] == "JobSet":
                js = d["metadata"]["name"]
                net = d["spec"].get("network", {})
                assert net.get("enableDNSHostnames"), "JobSet pods need DNS hostnames"
                sub = net.get("subdomain", js)
                for rj in d["spec"]["replicatedJobs"]:
                    assert rj.get("replicas", 1) == 1, "one slice per JobSet here"
                    spec = rj["template"]["spec"]
                    name = f"{js}-{rj['name']}-0"
                    out.append((path, spec, spec["template"]["spec"], lambda i, n=name, s=sub: f"{n}-{i}.{s}"))
    assert len(out) >= 3
    return out


@pytest.mark.parametrize("job", indexed_jobs(), ids=lambda j: os.path.basename(j[0]))
def test_every_pod_of_an_indexed_job_gets_its_ranks(job, slicetrain_bin):
    path, spec, pod, hostname = job
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert spec["parallelism"] == n, "all hosts must run at once"
    (c,) = pod["containers"]
    args = c["args"]
    command = args[args.index("--") + 1 :]
    acc, topo = flag(command, "--accelerator-type"), flag(command, "--topology")
    hosts, per_host = SLICES[(acc, topo)]
    assert n == hosts
    expected_hosts = [hostname(i) for i in range(n)]
    if acc.startswith("TPU"):
        sel = pod["nodeSelector"]
        assert sel["cloud.google.com/gke-tpu-topology"] == topo
        chips = int(c["resources"]["limits"]["google.com/tpu"])
        assert chips * (2 if acc == "TPU-V7X" else 1) == per_host
    for i in range(n):
        env = container_env(c, pod_ip=f"10.8.0.{i + 10}")
        env["JOB_COMPLETION_INDEX"] = str(i)  # set by the Job controller
        got = dry_run(slicetrain_bin, args, env)
        assert got["hosts"] == expected_hosts, "SLICETRAIN_HOSTS must list the pods' DNS names in index order"
        assert got["nnodes"] == n and got["node_rank"] == i
        assert got["nproc_per_node"] == per_host and got["world_size"] == hosts * per_host
        assert got["ranks"] == list(range(i * per_host, (i + 1) * per_host))
        assert got["master_addr"] == expected_hosts[0]
        assert got["master_port"] == 29500 and got["master_port_explicit"]
        assert got["secret_set"] and got["host_ip"] == f"10.8.0.{i + 10}"
        assert got["command"] == command


def ray_groups():
    out = []
    for path in manifest_files():
        for d in render(path):
            if d["kind"] == "RayCluster":
                for g in d["spec"]["workerGroupSpecs"]:
                    out.append((path, d["metadata"]["name"], g))
    assert len(out) >= 3
    return out


@pytest.mark.parametrize("group", ray_groups(), ids=lambda g: os.path.basename(g[0]))
def test_every_ray_host_gets_its_ranks(group, slicetrain_bin):
    """Each worker pod with the TPU webhook's variables: slicetrain's own detection and the Ray
    adapter's launch command agree on the host index (TPU_WORKER_ID) and the ranks."""
    path, cluster, g = group
    command = RAY_COMMANDS[os.path.basename(path)]
    shape = adapter.plan_slice(command)
    acc, topo = shape.accelerator_type, shape.topology
    hosts, per_host = SLICES[(acc, topo)]
    (c,) = g["template"]["spec"]["containers"]
    limits = c["resources"]["limits"]
    n_pods = g.get("replicas", 1) * g.get("numOfHosts", 1)
    assert n_pods == hosts
    pods = []
    if shape.is_tpu:
        assert g["replicas"] == 1 and g["numOfHosts"] == hosts, "one multi-host replica = one slice"
        assert g["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == topo
        per_chip = int(container_env(c, "")["RAY_TPU_RESOURCE_PER_CHIP"]) if acc == "TPU-V7X" else 1
        assert int(limits["google.com/tpu"]) * per_chip == per_host
        if "resources" in g:
            assert int(g["resources"]["TPU"]) == per_host
        names = [f"{g['groupName']}-0-{h}.{cluster}-headless" for h in range(hosts)]
        for h in range(hosts):
            env = container_env(c, pod_ip=f"10.9.{h}.5")
            env.update(  # what the KubeRay TPU webhook injects
                TPU_WORKER_HOSTNAMES=",".join(names),
                TPU_WORKER_ID=str(h),
                TPU_NAME=f"{g['groupName']}-0",
                TORCH_TPU_TOPOLOGY=TORCH_TPU_TOPOLOGY[topo],
            )
            pods.append(env)
    else:
        assert shape.is_gpu and int(limits["nvidia.com/gpu"]) == per_host == shape.nproc_per_node
        assert shape.num_hosts == hosts
        assert adapter.default_bundle(shape)["GPU"] == per_host
        names = None
        pods = [container_env(c, pod_ip=f"10.9.{h}.5") for h in range(hosts)]

    # Ray may hand out the bundles in any order: reverse it to show that ranks follow TPU_WORKER_ID.
    bundles = list(reversed(range(hosts)))
    infos = [{"ip": f"10.9.{b}.5", "tpu_worker_id": pods[b].get("TPU_WORKER_ID")} for b in bundles]
    order = adapter.assign_node_ranks(infos)
    master = infos[order[0]]["ip"]
    for rank, bi in enumerate(order):
        pod_env = pods[bundles[bi]]
        if names:  # slicetrain's own detection on that pod (e.g. `kubectl exec ... launch`)
            own = dry_run(slicetrain_bin, ["launch", "--nproc-per-node", str(per_host), "--", *command],
                          {**pod_env, "SLICETRAIN_SECRET": "s"})
            assert own["hosts"] == names and own["node_rank"] == int(pod_env["TPU_WORKER_ID"])
            assert own["world_size"] == hosts * per_host and own["tpu_topology"] == TORCH_TPU_TOPOLOGY[topo]
            assert rank == own["node_rank"], "the adapter's host order must be the webhook's"
        argv = adapter.launch_argv("slicetrain", rank, hosts, per_host, master, 29511, command)
        env = {**pod_env, "SLICETRAIN_SECRET": "s", "SLICETRAIN_HOST_IP": infos[bi]["ip"]}
        got = dry_run(slicetrain_bin, argv[1:], env)
        assert got["node_rank"] == rank and got["nnodes"] == hosts
        assert got["ranks"] == list(range(rank * per_host, (rank + 1) * per_host))
        assert got["master_addr"] == master and got["master_port"] == 29511
