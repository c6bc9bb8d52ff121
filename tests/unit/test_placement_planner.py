"""One test per sentence of the product page's "Place and scale replicas", "What replicas share"
and "CPU threads" sections (quoted above each test), on a fake GPU inventory and CPU budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sr.config.files import load_config, parse_config
from vllm_sr.config.flags import DeploymentFlags
from vllm_sr.config.schema import Replica
from vllm_sr.errors import PlacementError, UsageError
from vllm_sr.placement.apply import apply_flags, apply_scale
from vllm_sr.placement.cpu import CpuBudget
from vllm_sr.placement.gpus import MIB, GpuInfo
from vllm_sr.placement.planner import PlacementRequest, plan, resize_placement

GIB = 1024 * MIB
BUDGET8 = CpuBudget(cpus=8, affinity=tuple(range(8)), machine_cpus=8)


def rocm(n: int, free_gib: list[int] | None = None) -> list[GpuInfo]:
    free = free_gib or [32] * n
    return [GpuInfo("rocm", i, "MI100", 32 * GIB, (32 - free[i]) * GIB) for i in range(n)]


class Inventory:
    """Fake provider that also counts how often it was asked."""

    def __init__(self, gpus: list[GpuInfo]) -> None:
        self.gpus, self.calls = gpus, 0

    def __call__(self, platform: str) -> list[GpuInfo]:
        self.calls += 1
        return [g for g in self.gpus if g.platform == platform]


def apply(
    path: Path,
    gpus: list[GpuInfo] | None = None,
    env: dict[str, str] | None = None,
    budget: CpuBudget = BUDGET8,
    **flags,
):  # type: ignore[no-untyped-def]
    return apply_flags(
        path,
        DeploymentFlags(**flags),
        dry_run=False,
        env=env or {},
        inventory=Inventory(gpus or []),
        cpu_budget=budget,
    )


def devices(path: Path, deployment: str = "primary") -> list[str | None]:
    return [r.device for r in load_config(path).deployments[deployment].effective_replicas()]


TWO_DEPLOYMENTS = """\
global:
  model_catalog:
    deployments:
      embed:
        artifact: vllm-sr/d3-edge
        replicas:
          - device: cpu
      primary:
        artifact: vllm-sr/d3-edge
        engine_args:
          max_num_seqs: 16
        replicas:
          - device: rocm:0
    system:
      decision_model:
        deployment: primary
"""


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    return tmp_path / "config.yaml"


# Place and scale replicas ------------------------------------------------------------------


def test_dp_sets_the_default_deployments_worker_count(cfg: Path) -> None:
    """-dp sets the default deployment's independent worker count."""
    cfg.write_text(TWO_DEPLOYMENTS)
    result = apply(cfg, rocm(4), data_parallel_size=3)
    assert devices(cfg) == ["rocm:0", "rocm:1", "rocm:2"]
    assert devices(cfg, "embed") == ["cpu"]
    assert [r.id for r in result.plan.for_deployment("primary")] == [
        "primary-0",
        "primary-1",
        "primary-2",
    ]


def test_engine_arguments_are_separate_from_placement(cfg: Path) -> None:
    """Its engine arguments are separate from placement."""
    cfg.write_text(TWO_DEPLOYMENTS)
    apply(cfg, rocm(2), data_parallel_size=2)
    assert load_config(cfg).deployments["primary"].engine_args.max_num_seqs == 16
    apply(cfg, rocm(2), max_num_seqs=32)
    assert devices(cfg) == ["rocm:0", "rocm:1"]
    assert load_config(cfg).deployments["primary"].engine_args.max_num_seqs == 32
    assert load_config(cfg).deployments["primary"].engine_args.dtype == "auto"  # the default
    apply(cfg, rocm(2), dtype="float32")  # --dtype: written like the other engine flags
    args = load_config(cfg).deployments["primary"].engine_args
    assert (args.dtype, args.max_num_seqs) == ("float32", 32)
    assert "dtype: float32" in cfg.read_text()


def test_two_workers_on_one_explicitly_selected_gpu(cfg: Path) -> None:
    """# Two workers on one explicitly selected host GPU. (-dp 2 --device-ids 0)"""
    result = apply(
        cfg,
        rocm(2),
        model="vllm-sr/d3-edge",
        engine=True,
        platform="rocm",
        data_parallel_size=2,
        device_ids=(0,),
    )
    assert devices(cfg) == ["rocm:0", "rocm:0"]
    assert [r.env["ROCR_VISIBLE_DEVICES"] for r in result.plan.replicas] == ["0", "0"]


def test_two_workers_across_two_gpus(cfg: Path) -> None:
    """# Two workers across two host GPUs. (-dp 2 --device-ids 0,1)"""
    apply(
        cfg,
        rocm(2),
        model="vllm-sr/d3-edge",
        engine=True,
        platform="rocm",
        data_parallel_size=2,
        device_ids=(0, 1),
    )
    assert devices(cfg) == ["rocm:0", "rocm:1"]


def test_device_ids_alone_and_repeated(cfg: Path) -> None:
    """repeating a device explicitly starts multiple workers on that GPU"""
    apply(cfg, rocm(3), platform="rocm", device_ids=(2, 2, 1))
    assert devices(cfg) == ["rocm:2", "rocm:2", "rocm:1"]


def test_more_ids_than_workers_is_refused(cfg: Path) -> None:
    with pytest.raises(UsageError, match=r"--device-ids 0,1 names 2 GPUs for -dp 1"):
        apply(cfg, rocm(2), platform="rocm", data_parallel_size=1, device_ids=(0, 1))


def test_device_id_that_does_not_exist_is_refused(cfg: Path) -> None:
    with pytest.raises(PlacementError, match=r"device rocm:5 does not exist; 2 GPU\(s\) found"):
        apply(cfg, rocm(2), platform="rocm", device_ids=(5,))
    assert not cfg.exists()


def test_new_gpu_placement_uses_first_n_available(cfg: Path) -> None:
    """Without device IDs, a new GPU placement uses the first N available GPUs"""
    gpus = rocm(4, free_gib=[0, 32, 32, 32])  # GPU 0 is full
    result = apply(cfg, gpus, platform="rocm", data_parallel_size=2)
    assert devices(cfg) == ["rocm:1", "rocm:2"]
    assert any("rocm:0 skipped: 0 MiB free" in n for n in result.plan.notes)


def test_new_gpu_placement_refuses_insufficient_capacity(cfg: Path) -> None:
    """... and refuses insufficient capacity"""
    with pytest.raises(PlacementError) as exc:
        apply(cfg, rocm(2, free_gib=[32, 0]), platform="rocm", data_parallel_size=3)
    msg = exc.value.message
    assert "-dp 3: needs 3 more available rocm GPU(s) but found 1" in msg
    assert "2 GPU(s): rocm:0 MI100" in msg and "rocm:1 skipped" in msg
    assert not cfg.exists()


def test_never_silently_places_every_worker_on_one_card(cfg: Path) -> None:
    """it does not silently place every worker on one card."""
    with pytest.raises(PlacementError, match="--device-ids"):
        apply(cfg, rocm(1), platform="rocm", data_parallel_size=2)


def test_authored_placements_resize_in_declared_order(cfg: Path) -> None:
    """Existing authored placements resize in their declared order."""
    cfg.write_text(
        TWO_DEPLOYMENTS.replace(
            "          - device: rocm:0\n",
            "          - device: rocm:3\n          - device: rocm:1\n          - device: rocm:2\n",
        )
    )
    apply(cfg, rocm(4), data_parallel_size=2)
    assert devices(cfg) == ["rocm:3", "rocm:1"]
    apply(cfg, rocm(4), data_parallel_size=4)
    assert devices(cfg) == ["rocm:3", "rocm:1", "rocm:0", "rocm:2"]


def test_model_alone_preserves_replicas_and_engine_arguments(cfg: Path) -> None:
    """Specifying only MODEL preserves configured replicas and engine arguments."""
    cfg.write_text(TWO_DEPLOYMENTS.replace("- device: rocm:0", "- device: rocm:1"))
    inv = Inventory(rocm(2))
    result = apply_flags(
        cfg,
        DeploymentFlags(model="/models/other"),
        dry_run=False,
        env={},
        inventory=inv,
        cpu_budget=BUDGET8,
    )
    dep = load_config(cfg).deployments["primary"]
    assert dep.artifact == "/models/other"
    assert devices(cfg) == ["rocm:1"] and dep.engine_args.max_num_seqs == 16
    changed = [
        ln
        for ln in result.diff.splitlines()
        if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    ]
    assert changed == ["-        artifact: vllm-sr/d3-edge", "+        artifact: /models/other"]


def test_flags_write_the_canonical_resource_no_dp_state(cfg: Path) -> None:
    """These flags write the same canonical resource shown below; there is no separate DP
    state."""
    apply(
        cfg,
        rocm(2),
        model="vllm-sr/d3-edge",
        engine=True,
        platform="rocm",
        data_parallel_size=2,
        device_ids=(0, 1),
    )
    from tests.unit.test_config_schema import SEED_PLACEMENT

    assert load_config(cfg) == parse_config(SEED_PLACEMENT)
    assert sorted(p.name for p in cfg.parent.iterdir()) == ["config.yaml"]
    # scale goes through the same file
    apply_scale(cfg, "primary", 1, env={}, inventory=Inventory(rocm(2)), cpu_budget=BUDGET8)
    assert devices(cfg) == ["rocm:0"]


def test_kubernetes_device_ids_are_ordinals(cfg: Path) -> None:
    """For Kubernetes, use allocation ordinals in config instead of host IDs: in a pod every N,
    from a flag too, is an ordinal, so a host ID past the allocation is refused naming it."""
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "ROCR_VISIBLE_DEVICES": "3,5"}
    gpus = rocm(6)
    result = apply(cfg, gpus, env=env, platform="rocm", device_ids=(1,))
    assert devices(cfg) == ["rocm:1"]
    assert result.plan.replicas[0].env["ROCR_VISIBLE_DEVICES"] == "5"
    with pytest.raises(UsageError) as exc:
        apply(cfg, gpus, env=env, platform="rocm", device_ids=(3,))
    assert "ordinal 3 is outside the allocation (ROCR_VISIBLE_DEVICES=3,5" in exc.value.message
    assert devices(cfg) == ["rocm:1"]


def test_kubernetes_ordinals_map_into_the_pods_devices() -> None:
    config = parse_config(
        TWO_DEPLOYMENTS.replace(
            "          - device: rocm:0\n",
            "          - device: rocm:0\n          - device: rocm:1\n",
        )
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "ROCR_VISIBLE_DEVICES": "5,7"}
    p = plan(config, env=env, inventory_provider=Inventory(rocm(2)), cpu_budget=BUDGET8)
    assert [r.env["ROCR_VISIBLE_DEVICES"] for r in p.for_deployment("primary")] == ["5", "7"]
    bad = parse_config(TWO_DEPLOYMENTS.replace("rocm:0", "rocm:2"))
    with pytest.raises(PlacementError, match=r"outside the allocation \(ROCR_VISIBLE_DEVICES=5,7"):
        plan(bad, env=env, inventory_provider=Inventory(rocm(3)), cpu_budget=BUDGET8)


def test_each_worker_needs_memory_for_its_model(cfg: Path) -> None:
    """repeating a device ... each worker needs memory for its model."""
    gpus = [GpuInfo("rocm", 0, "small", 1 * GIB, 1 * GIB - 300 * MIB)]  # 300 MiB free
    result = apply(cfg, gpus, platform="rocm", device_ids=(0, 0))
    assert any(
        "2 worker(s) x ~173 MiB each exceed the 300 MiB free" in n for n in result.plan.notes
    )
    assert any("each holds its own copy of the weights" in n for n in result.plan.notes)


def test_gpu_env_per_platform() -> None:
    c = parse_config(TWO_DEPLOYMENTS.replace("rocm:0", "cuda:3"))
    gpus = [GpuInfo("cuda", i, "H100", 80 * GIB, 0) for i in range(4)]
    (spec,) = plan(
        c, env={}, inventory_provider=Inventory(gpus), cpu_budget=BUDGET8
    ).for_deployment("primary")
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert spec.torch_device == "cuda:0" and spec.threads is None


# What replicas share -----------------------------------------------------------------------

SHARED = """\
global:
  model_catalog:
    deployments:
      primary:
        artifact: vllm-sr/d3-edge
        revision: abc123
        timeout_ms: 1500
        replicas:
          - device: cpu
          - device: cpu
"""


def _plan(text: str, env: dict[str, str] | None = None, budget: CpuBudget = BUDGET8):  # type: ignore[no-untyped-def]
    return plan(
        parse_config(text), env=env or {}, inventory_provider=Inventory(rocm(4)), cpu_budget=budget
    )


def test_replicas_share_artifact_revision_and_leave_unset_limits_to_calibration() -> None:
    """All replicas of a deployment use the same artifact, revision, engine arguments and
    capabilities, except batch limits the deployment leaves unset"""
    specs = _plan(SHARED).replicas
    assert {(s.artifact, s.revision) for s in specs} == {("vllm-sr/d3-edge", "abc123")}
    assert {(s.max_num_seqs, s.max_num_batched_tokens) for s in specs} == {(None, None)}


def test_set_limits_reach_every_replica() -> None:
    """Set max_num_seqs and max_num_batched_tokens to give every replica the same limits"""
    text = SHARED.replace(
        "        timeout_ms",
        "        engine_args:\n          max_num_seqs: 8\n"
        "          max_num_batched_tokens: 512\n        timeout_ms",
    )
    assert {(s.max_num_seqs, s.max_num_batched_tokens) for s in _plan(text).replicas} == {(8, 512)}


def test_dtype_reaches_every_replica_and_its_worker_command() -> None:
    """engine_args.dtype is shared: every replica's spec carries it, its worker is started with
    --dtype (auto, the worker's own default, adds nothing), and a change of it restarts the
    replica on reload (it is part of the identity)."""
    from vllm_sr.supervisor.process import worker_command

    auto = _plan(SHARED).replicas
    assert {s.dtype for s in auto} == {"auto"}
    assert "--dtype" not in worker_command(auto[0], "/tmp/w.sock")
    text = SHARED.replace(
        "        timeout_ms", "        engine_args:\n          dtype: float32\n        timeout_ms"
    )
    forced = _plan(text).replicas
    assert {s.dtype for s in forced} == {"float32"}
    argv = worker_command(forced[0], "/tmp/w.sock")
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert forced[0].identity() != auto[0].identity()


def test_attached_replica_names_its_model() -> None:
    """an attached replica names its served model with its own model."""
    text = SHARED.replace(
        "          - device: cpu\n          - device: cpu\n",
        "          - endpoint: http://127.0.0.1:8100\n            model: m1\n",
    )
    (spec,) = _plan(text).replicas
    assert (spec.endpoint, spec.model, spec.device) == ("http://127.0.0.1:8100", "m1", None)
    assert spec.to_json()["model"] == "m1"


def test_shorthand_equals_an_explicit_single_replica() -> None:
    """Omitting replicas keeps the one-worker shorthand, with the same dispatch and status
    contract as an explicit single replica."""
    explicit = _plan(
        SHARED.replace(
            "          - device: cpu\n          - device: cpu\n", "          - device: rocm:1\n"
        )
    ).replicas
    short = _plan(
        SHARED.replace(
            "        replicas:\n          - device: cpu\n          - device: cpu\n",
            "        device: rocm:1\n",
        )
    ).replicas
    assert explicit == short and [s.id for s in short] == ["primary-0"]


def test_identity_ignores_bindings_and_non_placement_settings() -> None:
    """A replica's placement is independent of bindings, so changes to the signals that use a
    deployment retain unchanged worker identities."""
    base = [s.identity() for s in _plan(SHARED).replicas]
    rebound = SHARED.replace("global:\n", "global:\n  router:\n    enabled: false\n") + (
        "        outlier_detection:\n          consecutive_timeouts: 0\n"
        "    system:\n      decision_model:\n        deployment: primary\n"
    )
    assert [s.identity() for s in _plan(rebound.replace("1500", "900")).replicas] == base
    resized = _plan(SHARED.replace("abc123", "def456")).replicas
    assert [s.identity() for s in resized] != base


# CPU threads -------------------------------------------------------------------------------


def test_cpu_worker_defaults_to_half_the_budget() -> None:
    """Each managed CPU worker defaults to half the Router's available CPU budget, rounded
    down, with at least one thread and at most 16."""
    one = SHARED.replace(
        "          - device: cpu\n          - device: cpu\n", "          - device: cpu\n"
    )
    for cpus, want in [(1, 1), (7, 3), (64, 16)]:
        budget = CpuBudget(cpus=cpus, affinity=tuple(range(cpus)), machine_cpus=cpus)
        (spec,) = _plan(one, budget=budget).replicas
        assert spec.threads == want and spec.env["OMP_NUM_THREADS"] == str(want)


def test_env_override_sets_threads_not_workers() -> None:
    """VLLM_SRUN_CPU_THREADS=8 ... capped by the available CPU budget; it does not set the
    number of workers."""
    specs = _plan(SHARED, env={"VLLM_SRUN_CPU_THREADS": "8"}).replicas
    assert [s.threads for s in specs] == [8, 8]
    specs = _plan(SHARED, env={"VLLM_SRUN_CPU_THREADS": "64"}).replicas
    assert [s.threads for s in specs] == [8, 8]


def test_each_deployment_owns_an_independent_worker() -> None:
    """Each deployment or replica still owns an independent worker"""
    text = TWO_DEPLOYMENTS.replace("rocm:0", "cpu")
    specs = _plan(text).replicas
    assert [(s.id, s.threads) for s in specs] == [("embed-0", 4), ("primary-0", 4)]
    assert specs[0].cpus == (0, 1, 2, 3) and specs[1].cpus == (4, 5, 6, 7)


def test_mode_changes_do_not_redistribute_threads(cfg: Path) -> None:
    """mode changes do not redistribute threads among active workers."""
    cfg.write_text(SHARED)
    before = apply(cfg).plan.replicas
    after = apply(cfg, engine=True).plan.replicas
    assert [s.identity() for s in before] == [s.identity() for s in after]


def test_busy_workers_can_contend_when_over_budget() -> None:
    """This is a per-worker limit, so several busy workers can still contend for the same
    cores."""
    p = _plan(SHARED, env={"VLLM_SRUN_CPU_THREADS": "6"})
    assert [s.cpus for s in p.replicas] == [None, None]
    assert any("share CPUs" in n for n in p.notes)


def test_attached_runtimes_manage_their_own_threads() -> None:
    """Runtimes you attach through endpoint manage their own threads."""
    text = SHARED.replace(
        "          - device: cpu\n          - device: cpu\n",
        "          - endpoint: http://127.0.0.1:8100\n            model: m\n",
    )
    (spec,) = _plan(text, env={"VLLM_SRUN_CPU_THREADS": "4"}).replicas
    assert (spec.threads, spec.cpus, dict(spec.env)) == (None, None, {})


def test_bad_thread_env_is_an_error() -> None:
    from vllm_sr.errors import ConfigError

    with pytest.raises(ConfigError, match="VLLM_SRUN_CPU_THREADS='many'"):
        _plan(SHARED, env={"VLLM_SRUN_CPU_THREADS": "many"})


def test_point_threads_at_the_learned_optimum() -> None:
    """Point --threads at the learned optimum to apply it: a deployment's threads sets its CPU
    workers' count, wins over VLLM_SRUN_CPU_THREADS for that deployment (the variable still
    sizes the others), and is capped at the budget like the variable."""
    text = TWO_DEPLOYMENTS.replace("rocm:0", "cpu").replace(
        "      primary:\n", "      primary:\n        threads: 2\n"
    )
    p = _plan(text, env={"VLLM_SRUN_CPU_THREADS": "3"})
    assert [(s.id, s.threads, s.env["OMP_NUM_THREADS"]) for s in p.replicas] == [
        ("embed-0", 3, "3"),
        ("primary-0", 2, "2"),
    ]
    assert (
        "deployment primary: 2 thread(s) per CPU worker from its threads setting, over "
        "VLLM_SRUN_CPU_THREADS=3"
    ) in p.notes
    # disjoint sets of each worker's own size
    assert [s.cpus for s in p.replicas] == [(0, 1, 2), (3, 4)]
    capped = _plan(text.replace("threads: 2", "threads: 64"), env={}).for_deployment("primary")
    assert [s.threads for s in capped] == [8]


def test_threads_change_restarts_only_that_deployment() -> None:
    """threads is part of a worker's identity: a reload restarts the workers it changes."""
    text = TWO_DEPLOYMENTS.replace("rocm:0", "cpu")
    before = _plan(text).replicas
    after = _plan(text.replace("      primary:\n", "      primary:\n        threads: 1\n")).replicas
    changed = [a.id for a, b in zip(after, before, strict=True) if a.identity() != b.identity()]
    assert changed == ["primary-0"]


# Resize invariants over many shapes ---------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    authored=st.lists(st.integers(0, 7), min_size=1, max_size=6),
    count=st.integers(1, 12),
)
def test_resize_keeps_declared_order_and_never_stacks_new_workers(
    authored: list[int], count: int
) -> None:
    current = [Replica(device=f"rocm:{i}") for i in authored]
    inv = Inventory(rocm(8))
    try:
        new, _ = resize_placement(
            current, PlacementRequest(count=count), inventory=inv, need=None, env={}
        )
    except PlacementError as exc:
        fresh = 8 - len(set(authored[:count]))
        assert count - min(count, len(authored)) > fresh
        assert "lower -dp" in exc.message
        return
    devs = [r.device for r in new]
    assert len(devs) == count
    kept = min(count, len(authored))
    assert devs[:kept] == [f"rocm:{i}" for i in authored[:kept]]
    added = devs[kept:]
    assert len(set(added)) == len(added) and not set(added) & set(devs[:kept])


@settings(max_examples=200, deadline=None)
@given(
    authored=st.lists(st.integers(0, 7), min_size=1, max_size=4),
    elsewhere=st.sets(st.integers(0, 7)),
    count=st.integers(1, 8),
)
def test_growth_takes_gpus_no_other_deployment_uses_first(
    authored: list[int], elsewhere: set[int], count: int
) -> None:
    """A GPU another deployment is placed on is taken only once the unused ones are gone, and
    each one taken is named in a note."""
    current = [Replica(device=f"rocm:{i}") for i in authored]
    others = {f"rocm:{i}": ["other"] for i in elsewhere}
    try:
        new, notes = resize_placement(
            current,
            PlacementRequest(count=count),
            inventory=Inventory(rocm(8)),
            need=None,
            env={},
            others=others,
        )
    except PlacementError:
        assert count - min(count, len(authored)) > 8 - len(set(authored[:count]))
        return
    kept = min(count, len(authored))
    added = [r.device for r in new][kept:]
    shared = [d for d in added if d in others]
    assert added == [d for d in added if d not in others] + shared  # unused ones first
    free = {f"rocm:{i}" for i in range(8)} - set(others) - {r.device for r in current[:kept]}
    assert not shared or free <= set(added)  # shared only when the unused ones ran out
    assert [n.split(" ")[0] for n in notes if "shared with" in n] == shared
