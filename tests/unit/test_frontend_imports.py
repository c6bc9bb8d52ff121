"""Lazy Router mode (issue 27): Engine mode imports no router and no numpy. Each check runs in a
fresh interpreter, so that a module another test imported cannot hide (or fake) an import.

The Engine-mode path is the one ``vllm-sr serve -e`` takes: the serve command and the service
module imported, config.yaml planned with routing off, the frontend built on that plan and
asked for a chat (a typed 404). The Router-mode run of the same script is the control: there
the router must load, or the first check could pass by never reaching the mount."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("vllm_sr.router", "numpy")


def loaded_after(code: str) -> tuple[list[str], str]:
    """Run ``code`` in a fresh interpreter; -> (the HEAVY modules it left in sys.modules,
    what it printed before that)."""
    script = (
        f"{code}\nimport sys\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy' "
        f"or m.startswith({HEAVY[0]!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *before, last = proc.stdout.strip().splitlines()
    return json.loads(last.replace("'", '"')), "\n".join(before)


@pytest.mark.parametrize(
    "module", ["vllm_sr.frontend.app", "vllm_sr.supervisor.service", "vllm_sr.commands.serve"]
)
def test_importing_the_serve_path_loads_no_router_and_no_numpy(module: str) -> None:
    loaded, _ = loaded_after(f"import {module}")
    assert loaded == [], f"{module} imports {loaded[:8]}"


SERVE = """
import asyncio
from vllm_sr.config.files import parse_config
from vllm_sr.frontend.app import Frontend
from vllm_sr.httpserver import Request
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.supervisor.service import service_plan

config = parse_config('''
global:
  router:
    enabled: ROUTER
providers:
  defaults: {default_model: general}
  models: [{name: general, backend_refs: [{endpoint: "127.0.0.1:9"}]}]
''')
plan = service_plan(config, [])


class Service:
    directory = PoolDirectory()
    admitting = True

    def router_plan(self):
        return plan.router


async def main():
    frontend = Frontend(Service())
    await frontend.sync_router()
    chat = Request("POST", "/v1/chat/completions", "", {}, b'{"model": "general"}')
    answer = await frontend.chat_completions(chat)
    print(answer.status, frontend.chat.inventory() is None)
    await frontend.stop()


asyncio.run(main())
"""


def test_engine_mode_plans_and_answers_chat_without_the_router() -> None:
    loaded, printed = loaded_after(SERVE.replace("ROUTER", "false"))
    assert printed == "404 True"  # chat in Engine mode: the typed 404, no router inventory
    assert loaded == []


def test_router_mode_loads_the_router_when_its_plan_arrives() -> None:
    loaded, printed = loaded_after(SERVE.replace("ROUTER", "true"))
    assert printed.split()[1] == "False"  # a router inventory: the mount was built
    assert "vllm_sr.router.chat" in loaded and "numpy" in loaded
