"""Upstream v0.4's deployment fields (issue 38 item 5): revision, profile, input{max_tokens,
overflow}, public_name and device: auto; each acted on, or refused naming the field, the value
and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sr.cli import main
from vllm_sr.config.files import parse_config
from vllm_sr.config.schema import Replica
from vllm_sr.errors import ConfigError, MaxLengthExceeded, PlacementError, UsageError
from vllm_sr.kube.sizing import size_pod
from vllm_sr.placement.cpu import CpuBudget
from vllm_sr.placement.gpus import MIB, GpuInfo
from vllm_sr.placement.planner import PlacementRequest, plan, resize_placement
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.supervisor.process import worker_command
from vllm_sr.supervisor.service import service_plan
from vllm_sr.worker.surfaces import ModelView, input_limit, token_rows, tokenize

BUDGET = CpuBudget(cpus=8, affinity=tuple(range(8)), machine_cpus=8)


def _config(body: str, name: str = "primary") -> str:
    return (
        f"global:\n  model_catalog:\n    deployments:\n      {name}:\n"
        "        artifact: vllm-sr/d3-edge\n" + body
    )


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "config.yaml")
    return exc.value.problems


def _gpus(platform: str, n: int) -> list[GpuInfo]:
    return [GpuInfo(platform, i, "GPU", 16 * 1024 * MIB, 0) for i in range(n)]


class Inventory:
    def __init__(self, gpus: list[GpuInfo], missing: tuple[str, ...] = ()) -> None:
        self.gpus, self.missing = gpus, missing
        self.asked: list[str] = []

    def __call__(self, platform: str) -> list[GpuInfo]:
        self.asked.append(platform)
        if platform in self.missing:
            raise PlacementError(f"{platform}: tool not found")
        return [g for g in self.gpus if g.platform == platform]


def _plan(text: str, inv: Inventory, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return plan(parse_config(text), env=env or {}, inventory_provider=inv, cpu_budget=BUDGET)


# -- profile -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["exact", "batching", "max_speed"])
def test_profile_is_refused_by_name_with_the_reason(value: str) -> None:
    (problem,) = _problems(_config(f"        profile: {value}\n"))
    assert "profile" in problem and value in problem
    assert "one engine path" in problem and "accepted: omit profile" in problem


# -- input -------------------------------------------------------------------------------


def test_input_reaches_every_replica_and_its_worker_command() -> None:
    text = _config(
        "        input: {max_tokens: 64, overflow: truncate}\n"
        "        replicas: [{device: cpu}, {device: cpu}]\n"
    )
    specs = _plan(text, Inventory([])).replicas
    assert {(s.max_input_tokens, s.overflow) for s in specs} == {(64, "truncate")}
    argv = worker_command(specs[0], "/tmp/w.sock")
    assert argv[argv.index("--max-input-tokens") + 1] == "64"
    assert argv[argv.index("--overflow") + 1] == "truncate"
    default = _plan(_config("        device: cpu\n"), Inventory([])).replicas[0]
    assert (default.max_input_tokens, default.overflow) == (None, "reject")
    plain = worker_command(default, "/tmp/w.sock")
    assert "--max-input-tokens" not in plain and "--overflow" not in plain
    assert default.identity() != specs[0].identity()  # a change restarts the worker


def test_overflow_window_is_refused_with_the_reason() -> None:
    (problem,) = _problems(_config("        input: {max_tokens: 64, overflow: window}\n"))
    assert "overflow" in problem and "window" in problem
    assert "accepted: reject" in problem and "truncate" in problem


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        ("input: {overflow: drop}", "'drop'"),
        ("input: {max_tokens: 0}", "max_tokens"),
        ("input: {max_tokens: 64, stride: 8}", "stride"),
    ],
)
def test_bad_input_values_name_field_and_value(body: str, wanted: str) -> None:
    problems = _problems(_config(f"        {body}\n"))
    assert any(wanted in p and "input" in p for p in problems), problems


def test_input_limit_caps_at_the_model_and_names_which_limit() -> None:
    assert input_limit(512, None) == input_limit(512, 512)
    assert input_limit(512, 4096).tokens == 512
    assert input_limit(512, 4096).name == "the model's maximum"
    small = input_limit(512, 8)
    assert (small.tokens, small.name) == (8, "the deployment's input.max_tokens")


def _view(limit: int, truncates: bool) -> ModelView:
    chosen = input_limit(100, limit)
    return ModelView(
        name="m",
        names=frozenset({"m"}),
        dimensions=4,
        max_length=chosen.tokens,
        head_labels=None,
        encode=lambda texts: [list(range(len(t.split()))) for t in texts],
        truncate=lambda ids, n: ids[:n],
        vocab_size=1000,
        limit_name=chosen.name,
        overflow_truncates=truncates,
    )


def test_reject_answers_max_length_exceeded_naming_the_limit() -> None:
    view = _view(8, truncates=False)
    with pytest.raises(MaxLengthExceeded) as exc:
        tokenize(["a " * 12], view, truncate=False)
    assert exc.value.http_status == 400
    assert "12 tokens is over the deployment's input.max_tokens of 8" in exc.value.message
    with pytest.raises(MaxLengthExceeded):
        token_rows([list(range(12))], view, truncate=False)
    # the request may still ask for truncation itself
    assert tokenize(["a " * 12], view, truncate=True) == [list(range(8))]


def test_truncate_cuts_text_and_token_ids_without_the_request_asking() -> None:
    view = _view(8, truncates=True)
    assert tokenize(["a " * 12, "b c"], view, truncate=False) == [list(range(8)), [0, 1]]
    assert token_rows([list(range(12))], view, truncate=False) == [list(range(8))]


# -- public_name -------------------------------------------------------------------------


def test_public_name_is_accepted_by_the_worker_and_resolves_in_the_directory() -> None:
    text = _config("        public_name: acme/encoder\n        device: cpu\n")
    config = parse_config(text)
    specs = plan(config, env={}, inventory_provider=Inventory([]), cpu_budget=BUDGET).replicas
    argv = worker_command(specs[0], "/tmp/w.sock")
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "--served-model-name"]
    assert names == ["primary", "acme/encoder"]
    sp = service_plan(config, specs)
    assert sp.deployments["primary"].public_name == "acme/encoder"
    directory = PoolDirectory()
    pool = object()
    directory.publish({"primary": pool}, "primary", {"acme/encoder": "primary"})  # type: ignore[dict-item]
    assert directory.resolve("acme/encoder") is pool


@pytest.mark.parametrize(
    ("second", "wanted"),
    [
        ("public_name: primary", "is the name of deployment 'primary'"),
        ("public_name: shared", "also deployment 'primary''s public_name"),
    ],
)
def test_public_name_must_name_one_deployment(second: str, wanted: str) -> None:
    text = (
        _config("        public_name: shared\n")
        + f"      other:\n        artifact: vllm-sr/d3-edge\n        {second}\n"
    )
    problems = _problems(text)
    assert any("public_name" in p and wanted in p for p in problems), problems


# -- device: auto ------------------------------------------------------------------------


def test_auto_picks_a_gpu_when_the_inventory_lists_one() -> None:
    text = _config("        replicas: [{device: auto}, {device: auto}, {device: auto}]\n")
    inv = Inventory(_gpus("cuda", 2), missing=("rocm",))
    result = _plan(text, inv)
    assert [s.device for s in result.replicas] == ["cuda:0", "cuda:1", "cuda:0"]
    assert any("device auto: cuda GPUs cuda:0, cuda:1" in n for n in result.notes)


def test_auto_uses_rocm_when_cuda_has_no_tool() -> None:
    inv = Inventory(_gpus("rocm", 1), missing=("cuda",))
    result = _plan(_config("        device: auto\n"), inv)
    assert [s.device for s in result.replicas] == ["rocm:0"]


def test_auto_uses_an_allocation_ordinal_when_given_gpus() -> None:
    inv = Inventory(_gpus("cuda", 4))
    result = _plan(_config("        device: auto\n"), inv, env={"CUDA_VISIBLE_DEVICES": "3"})
    (spec,) = result.replicas
    assert (spec.device, spec.host_device) == ("cuda:0", "cuda:3")


def test_auto_falls_back_to_cpu_with_threads_and_says_why() -> None:
    text = _config("        threads: 2\n        device: auto\n")
    result = _plan(text, Inventory([], missing=("cuda", "rocm")))
    (spec,) = result.replicas
    assert (spec.device, spec.threads) == ("cpu", 2)
    assert any("no GPU in the inventory" in n and "cuda: tool not found" in n for n in result.notes)


def test_auto_without_gpu_checks_plans_cpu_and_asks_no_inventory() -> None:
    inv = Inventory(_gpus("cuda", 1))
    result = plan(
        parse_config(_config("        device: auto\n")),
        env={},
        inventory_provider=inv,
        cpu_budget=BUDGET,
        check_gpus=False,
    )
    assert [s.device for s in result.replicas] == ["cpu"] and inv.asked == []


def test_no_auto_asks_no_inventory() -> None:
    inv = Inventory(_gpus("cuda", 1))
    _plan(_config("        device: cpu\n"), inv)
    assert inv.asked == []


def test_auto_mixed_with_an_explicit_gpu_is_refused() -> None:
    problems = _problems(_config("        replicas: [{device: cuda:0}, {device: auto}]\n"))
    assert any("'auto'" in p and "one platform per deployment" in p for p in problems), problems


def test_a_bad_device_lists_auto_among_the_accepted() -> None:
    problems = _problems(_config("        device: tpu:0\n"))
    assert any("'tpu:0'" in p and "auto, cpu, rocm:N or cuda:N" in p for p in problems)


# -- revision ----------------------------------------------------------------------------


def test_revision_reaches_the_worker_command() -> None:
    text = _config("        revision: 0123456789abcdef\n        device: cpu\n")
    (spec,) = _plan(text, Inventory([])).replicas
    argv = worker_command(spec, "/tmp/w.sock")
    assert argv[argv.index("--revision") + 1] == "0123456789abcdef"


def test_dp_on_an_auto_deployment_keeps_auto_and_device_ids_need_a_platform() -> None:
    current = [Replica(device="auto")]
    new, _ = resize_placement(
        current, PlacementRequest(count=3), inventory=Inventory([]), need=None, env={}
    )
    assert [r.device for r in new] == ["auto", "auto", "auto"]
    with pytest.raises(UsageError, match="the platform is auto; add --platform"):
        resize_placement(
            current, PlacementRequest(device_ids=(0,)), inventory=None, need=None, env={}
        )
    moved, _ = resize_placement(
        current,
        PlacementRequest(platform="cuda", count=1),
        inventory=Inventory(_gpus("cuda", 1)),
        need=None,
        env={},
    )
    assert [r.device for r in moved] == ["cuda:0"]


def test_kubernetes_render_refuses_auto_naming_the_replica() -> None:
    text = _config("        device: cpu\n") + "      second:\n        replicas: [{device: auto}]\n"
    config = parse_config(text)
    with pytest.raises(PlacementError) as exc:
        size_pod(config, threads=2)
    assert "replica second-0: device 'auto' cannot be rendered" in exc.value.message
    assert "accepted: cpu, rocm:N or cuda:N" in exc.value.message


def test_config_show_says_auto_is_chosen_when_the_service_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(_config("        device: auto\n"))
    with pytest.raises(SystemExit) as exc:
        main(["config", "show", "--config", str(cfg)])
    assert not exc.value.code
    out = capsys.readouterr().out
    assert "#   primary-0: auto = chosen when the service plans" in out
    assert "host auto" not in out
    parse_config(out)  # still loadable
