"""`vllm-sr render kubernetes --config config.yaml [...]`: Kubernetes manifests from the canonical
config. A verb of its own rather than upstream's ``serve --target kubernetes``: serve runs the
service on this host (and writes flags into config.yaml), while rendering starts nothing and
writes nothing but manifests; one command doing both would make a typo in a flag either start
a service or not. Documented in docs/kubernetes.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_sr.config.files import DEFAULT_CONFIG_PATH
from vllm_sr.errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "render",
        help="write deployment manifests from config.yaml (starts nothing)",
        description="Write deployment manifests from config.yaml; starts nothing.",
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    k = targets.add_parser(
        "kubernetes",
        help="ConfigMap, StatefulSet, Services and PodDisruptionBudget per host group",
        description="Kubernetes manifests: a ConfigMap holding config.yaml, a StatefulSet per "
        "host group (each pod runs `vllm-sr serve`), GPU limits from the allocation ordinals, "
        "CPU from the CPU budget rules, Services, probes, drain on termination and a "
        "PodDisruptionBudget. Exit 78 when the config cannot run in a pod (host GPU IDs, two "
        "GPU platforms in one pod).",
    )
    k.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG_PATH, metavar="PATH",
        help=f"default {DEFAULT_CONFIG_PATH}",
    )  # fmt: skip
    k.add_argument("--image", metavar="IMAGE", help="default vllm-sr:<version>-<platform>")
    k.add_argument("--namespace", metavar="NS", help="default: none (kubectl's -n applies)")
    k.add_argument("--name", default="vllm-sr", help="object name prefix (default vllm-sr)")
    k.add_argument(
        "--out", type=Path, metavar="DIR", help="one file per object in DIR (default: stdout)"
    )
    k.add_argument(
        "--pods", type=int, default=1, metavar="N",
        help="pods of the group that answers clients (default 1)",
    )  # fmt: skip
    k.add_argument(
        "--frontend-pods", type=int, metavar="N",
        help="run the config's replicas in N worker pods behind one frontend (endpoint: "
        "replicas through a headless Service)",
    )  # fmt: skip
    k.add_argument(
        "--cpu-threads", type=int, default=2, metavar="T",
        help="threads per CPU worker (sets VLLM_SRUN_CPU_THREADS and the CPU request; default 2)",
    )  # fmt: skip
    k.set_defaults(func=_kubernetes)


def _kubernetes(args: argparse.Namespace) -> int:
    from vllm_sr.kube.manifests import RenderOptions, render
    from vllm_sr.kube.output import to_stream, write_dir

    try:
        text = args.config.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"--config {args.config}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {args.config}: cannot read: {exc}") from exc
    opts = RenderOptions(
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        pods=args.pods,
        frontend_pods=args.frontend_pods,
        cpu_threads=args.cpu_threads,
    )
    objs = render(text, str(args.config), opts)
    if args.out is None:
        sys.stdout.write(to_stream(objs))
        return 0
    for path in write_dir(objs, args.out):
        print(path)
    return 0
