"""mini-swe-agent as tests/rollout/test_mini_swe_agent.py runs it (`spec.environment.agent:
helpers.mini_swe_agent_job:solve`): mini-swe-agent's own agent, model and templates engine, with a configuration
for a tiny model: short templates (its context is 2048 tokens), a step limit, and the whole answer taken as the
command (a random tiny model never writes a fenced block; this way its commands reach the sandbox).
Each episode's mini-swe-agent trajectory is saved under $KUBERL_TEST_MSWEA_DIR."""

from __future__ import annotations

import os

from kuberl.integrations.mini_swe_agent import entry_point

STEPS = 8
"""Model calls an episode (mini-swe-agent's step limit): within the job's maxTurns, so every one runs."""

CONFIG = {
    "agent": {
        "system_template": "You fix bugs. Answer with one shell command.",
        "instance_template": "{{task}}",
        "step_limit": STEPS,
        "max_consecutive_format_errors": 0,
    },
    "model": {
        "action_regex": r"(.+)",
        "model_kwargs": {"max_tokens": 24},
        "observation_template": "{{ output.output[-200:] }}\n[exit code {{ output.returncode }}]",
    },
    "environment": {"env": {"PAGER": "cat"}},
}

solve = entry_point(CONFIG, trajectories=os.environ.get("KUBERL_TEST_MSWEA_DIR"))
