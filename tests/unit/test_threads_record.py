"""Host records for adaptive threads (mode 2 needs one), the GPU refusal, and the learner's
log line naming the setting that applies its optimum. All on data: host facts are given, the
records live in a temporary directory, the learner runs on the fake model of test_threads."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy
import pytest

from tests.unit.test_threads import make, run_until
from vllm_sr.errors import ConfigError
from vllm_sr.events import THREADS_LEARNED
from vllm_sr.worker.learner import AdaptiveThreads
from vllm_sr.worker.policy import policy_from_env
from vllm_sr.worker.threads import ENV_ADAPTIVE, FixedThreads
from vllm_sr.worker.threads_record import (
    DRIFTED,
    ENV_RECORD_DIR,
    IDENTICAL,
    HostFacts,
    HostRecords,
    _cpu_model,
    record_dir,
)

FACTS = HostFacts("Intel(R) Xeon(R) Platinum 8480+", "2.5.1+cpu", "6.8.0-45-generic")


def test_record_dir_precedence() -> None:
    assert record_dir({ENV_RECORD_DIR: "/srv/state", "XDG_STATE_HOME": "/x"}) == Path("/srv/state")
    assert record_dir({"XDG_STATE_HOME": "/x", "HOME": "/h"}) == Path("/x/vllm-sr")
    assert record_dir({"HOME": "/h"}) == Path("/h/.local/state/vllm-sr")


def test_cpu_model_from_proc_cpuinfo() -> None:
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: AMD EPYC 9654 96-Core\n"
    assert _cpu_model(text) == "AMD EPYC 9654 96-Core"
    assert _cpu_model("processor : 0\nModel : Raspberry Pi 5\n") == "Raspberry Pi 5"


def test_a_record_vouches_only_for_its_host_and_the_counts_it_checked(tmp_path: Path) -> None:
    records = HostRecords(tmp_path, FACTS)
    why = records.vouches_for([1, 2, 4])
    assert why is not None and "no record at" in why and str(records.path) in why
    records.learned([1, 2], ["9-16"])
    assert records.vouches_for([1, 2]) is None
    assert records.vouches_for([1, 2, 4]) == (
        f"the record at {records.path} ({FACTS.describe()}) never checked counts [4]"
    )
    records.learned([2, 4], ["129-256"])  # a later mode-1 run widens the record
    assert records.vouches_for([1, 2, 4]) is None
    doc = json.loads(records.path.read_text())
    assert doc["host"] == {
        "cpu_model": FACTS.cpu_model,
        "torch_version": FACTS.torch_version,
        "kernel": FACTS.kernel,
    }
    assert doc["counts_checked"] == [1, 2, 4] and doc["result"] == IDENTICAL
    assert doc["buckets"] == ["129-256", "9-16"]
    for other in (
        HostFacts(FACTS.cpu_model, "2.6.0+cpu", FACTS.kernel),  # torch upgraded
        HostFacts(FACTS.cpu_model, FACTS.torch_version, "6.9.0"),  # kernel upgraded
        HostFacts("AMD EPYC 9654", FACTS.torch_version, FACTS.kernel),  # another CPU
    ):
        assert "no record at" in (HostRecords(tmp_path, other).vouches_for([1]) or "")


def test_a_drift_revokes_the_record_for_good(tmp_path: Path) -> None:
    records = HostRecords(tmp_path, FACTS)
    records.learned([1, 2, 4], ["9-16"])
    records.drifted([1, 2], "2 threads drifted from the answer at 1 on bucket 5-8")
    records.learned([1, 2, 4], ["9-16"])  # a later clean run does not undo it
    why = records.vouches_for([1, 2])
    assert why is not None and repr(DRIFTED) in why and "bucket 5-8" in why


def test_an_unwritable_record_dir_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="vllm_sr.worker.threads"):
        HostRecords(blocker / "sub", FACTS).learned([1], [])
    assert "cannot write" in caplog.text


def test_mode2_without_a_record_falls_back_to_mode1_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {ENV_ADAPTIVE: "2", ENV_RECORD_DIR: str(tmp_path)}
    with caplog.at_level(logging.WARNING, logger="vllm_sr.worker.threads"):
        policy = policy_from_env(2, 4, env, facts=lambda: FACTS)
    assert isinstance(policy, AdaptiveThreads) and policy.mode == 1
    path = str(HostRecords(tmp_path, FACTS).path)
    assert path in caplog.text and "mode 1" in caplog.text
    report = policy.report()
    assert report is not None and report["mode"] == 1 and path in report["fallback"]
    HostRecords(tmp_path, FACTS).learned([1, 2], [])  # 4 never checked: still refused
    assert policy_from_env(2, 4, env, facts=lambda: FACTS).mode == 1  # type: ignore[attr-defined]
    HostRecords(tmp_path, FACTS).learned([4], [])
    policy = policy_from_env(2, 4, env, facts=lambda: FACTS)
    assert isinstance(policy, AdaptiveThreads) and policy.mode == 2 and policy.fallback is None


@pytest.mark.parametrize("value", ["1", "2"])
def test_a_gpu_worker_refuses_adaptive_threads_and_serves_fixed(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    def no_facts() -> HostFacts:
        raise AssertionError("a GPU worker never looks for a host record")

    with caplog.at_level(logging.WARNING, logger="vllm_sr.worker.threads"):
        policy = policy_from_env(3, 8, {ENV_ADAPTIVE: value}, device="cuda:0", facts=no_facts)
    assert isinstance(policy, FixedThreads) and policy.threads_for(4096) == 3
    assert policy.report() is None
    assert f"{ENV_ADAPTIVE}={value} is refused on cuda:0" in caplog.text
    with pytest.raises(ConfigError):  # a bad value is still a bad value
        policy_from_env(3, 8, {ENV_ADAPTIVE: "yes"}, device="rocm:1")


def test_mode1_writes_the_record_once_learned_and_names_the_setting(tmp_path: Path) -> None:
    records = HostRecords(tmp_path, FACTS)
    policy, engine, events = make(1, records=records)
    policy.golden_passed()
    run_until(engine, lambda: policy.report()["state"] == "learned")  # type: ignore[index]
    assert records.vouches_for([1, 2, 4]) is None
    assert sorted(json.loads(records.path.read_text())["buckets"]) == ["129-256", "9-16"]
    last = [f for name, f in events if name == THREADS_LEARNED][-1]
    assert last["recommended"] == 4
    assert last["apply"] == (
        "threads: 4 on the deployment in config.yaml (or vllm-sr serve --threads 4)"
    )
    report = policy.report()
    assert report is not None and report["apply"] == last["apply"]


def test_a_drift_in_mode1_writes_a_drifted_record(tmp_path: Path) -> None:
    records = HostRecords(tmp_path, FACTS)
    policy, engine, _ = make(1, drift=lambda threads, n: threads == 4, records=records)
    policy.golden_passed()
    run_until(engine, lambda: policy.retired)
    doc = json.loads(records.path.read_text())
    assert doc["result"] == DRIFTED and doc["counts_checked"] == [2, 4]
    assert "4 threads drifted" in doc["detail"]


def test_mode2_learning_writes_no_bit_identical_record(tmp_path: Path) -> None:
    records = HostRecords(tmp_path, FACTS)
    policy, engine, _ = make(2, records=records)
    policy.golden_passed()
    run_until(engine, lambda: policy.report()["state"] != "exploring")  # type: ignore[index]
    assert not records.path.exists()


def test_ctl_threads_text_shows_the_setting_and_a_fallback(tmp_path: Path) -> None:
    from vllm_sr.control.threads_report import format_report

    env = {ENV_ADAPTIVE: "2", ENV_RECORD_DIR: str(tmp_path)}
    policy = policy_from_env(2, 4, env, facts=lambda: FACTS)
    text = format_report(policy.report())
    assert "note: VLLM_SRUN_CPU_ADAPTIVE_THREADS=2 asked" in text and "no record at" in text
    policy, engine, _ = make(1)
    policy.golden_passed()
    run_until(engine, lambda: policy.report()["state"] == "learned")  # type: ignore[index]
    assert "to apply: threads: 4 on the deployment" in format_report(policy.report())


# -- a drift the record keeps retires every later start, mode 1 too (issue 30) --------------


@pytest.mark.parametrize("mode", ["1", "2"])
def test_a_restarted_worker_on_a_drifted_host_is_retired_at_once(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm_sr.control.threads_report import format_report

    # The first worker drifts in mode 1 and writes the record...
    records = HostRecords(tmp_path, FACTS)
    first, engine, _ = make(1, drift=lambda threads, n: threads == 4, records=records)
    first.golden_passed()
    run_until(engine, lambda: first.retired)
    # ...the restarted one (same host) explores nothing: retired before its golden check.
    env = {ENV_ADAPTIVE: mode, ENV_RECORD_DIR: str(tmp_path)}
    with caplog.at_level(logging.WARNING, logger="vllm_sr.worker.threads"):
        policy = policy_from_env(2, 4, env, facts=lambda: FACTS)
    assert isinstance(policy, AdaptiveThreads) and policy.retired and policy.mode == 1
    assert "retired at start" in caplog.text and str(records.path) in caplog.text
    report = policy.report()
    assert report is not None and report["state"] == "retired" and report["recorded_drift"]
    assert str(records.path) in report["retire_reason"] and "remove" in report["retire_reason"]
    assert "4 threads drifted" in report["retire_reason"]
    policy.golden_passed()
    passes: list[int] = []

    def rerun(n: int) -> Any:
        passes.append(n)
        raise AssertionError("a retired learner runs no pass")

    for rows in ([[1] * 10], [[2] * 100]):
        assert policy.threads_for(len(rows[0])) == 2
        policy.after_forward(rows, numpy.zeros((1, 2)), 2, 0.01, rerun)
    assert passes == [] and policy.report()["shadow_passes"] == 0  # type: ignore[index]
    text = format_report(policy.report())
    assert "state retired (recorded drift)" in text
    assert f"host record: {records.path}" in text
    # Removing the record is how to relearn.
    records.path.unlink()
    again = policy_from_env(
        2, 4, {ENV_ADAPTIVE: "1", ENV_RECORD_DIR: str(tmp_path)}, facts=lambda: FACTS
    )
    assert isinstance(again, AdaptiveThreads) and not again.retired
    assert again.report()["state"] == "exploring"  # type: ignore[index]


def test_another_hosts_drift_does_not_retire_this_one(tmp_path: Path) -> None:
    HostRecords(tmp_path, FACTS).drifted([1, 2], "elsewhere")
    other = HostFacts(FACTS.cpu_model, "2.6.0+cpu", FACTS.kernel)  # torch upgraded: new record
    policy = policy_from_env(
        2, 4, {ENV_ADAPTIVE: "1", ENV_RECORD_DIR: str(tmp_path)}, facts=lambda: other
    )
    assert isinstance(policy, AdaptiveThreads) and not policy.retired
    assert HostRecords(tmp_path, other).recorded_drift() is None
    assert HostRecords(tmp_path, FACTS).recorded_drift() == "elsewhere"


def test_a_float32_record_vouches_for_nothing_at_bfloat16(tmp_path: Path) -> None:
    """Bit-identity across counts is a property of the kernels: bf16 kernels are other
    kernels, so a record is kept per served dtype (a float32 one keeps its old file)."""
    HostRecords(tmp_path, FACTS).learned([1, 2, 4], ["9-16"])
    bf16 = HostFacts(FACTS.cpu_model, FACTS.torch_version, FACTS.kernel, "bfloat16")
    old_key = "\0".join((FACTS.cpu_model, FACTS.torch_version, FACTS.kernel))
    assert FACTS.key() == hashlib.sha256(old_key.encode()).hexdigest()[:16]  # records kept
    assert bf16.key() != FACTS.key()
    assert "no record at" in (HostRecords(tmp_path, bf16).vouches_for([1]) or "")
    assert "dtype bfloat16" in (HostRecords(tmp_path, bf16).vouches_for([1]) or "")
    HostRecords(tmp_path, bf16).learned([1, 2], ["9-16"])
    doc = json.loads(HostRecords(tmp_path, bf16).path.read_text())
    assert doc["host"]["dtype"] == "bfloat16"
    assert HostRecords(tmp_path, bf16).vouches_for([1, 2]) is None
    assert HostRecords(tmp_path, FACTS).vouches_for([1, 2, 4]) is None
