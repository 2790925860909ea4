"""A server's admission limits as its /server_info reports them (SGLang 0.5.23).

`max_running_requests` at the top level is the resolved server argument: what the user set, 48 for DFLASH when
unset (arg_groups/speculative_hook.py), None for a plain server that derives its limit from memory. The
scheduler's own figure is `internal_states[0].effective_max_running_requests_per_dp` (per data-parallel rank);
`max_total_num_tokens`, the KV-cache capacity, is at the top level.
"""

from __future__ import annotations

from typing import Any


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def admission_limits(info: Any) -> dict[str, int | None]:
    """{"max_running_requests", "max_total_num_tokens"} of a /server_info document (None where not reported):
    the scheduler's effective limit times the data-parallel size where it reports one, else the argument."""
    if not isinstance(info, dict):
        return {"max_running_requests": None, "max_total_num_tokens": None}
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    effective = _int(state.get("effective_max_running_requests_per_dp"))
    running = effective * (_int(info.get("dp_size")) or 1) if effective else _int(info.get("max_running_requests"))
    tokens = _int(info.get("max_total_num_tokens")) or _int(state.get("max_total_num_tokens"))
    return {"max_running_requests": running, "max_total_num_tokens": tokens}
