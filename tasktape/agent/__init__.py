"""The built-in demo agent: an A2A v1.0 agent on aiohttp that streams like the hosted API
its lifecycle document describes, with a scenario for every way a task can end."""

from .app import JSONRPC_PATH, create_agent_app
from .scenarios import Scenario, choose

__all__ = ["JSONRPC_PATH", "Scenario", "choose", "create_agent_app"]
