"""The learning curve of a run as a PNG: reward and solve rate against step and against wall-clock."""

from __future__ import annotations

from pathlib import Path


def plot_learning_curve(
    lines: list[dict], out: Path, title: str, evaluations: dict[str, float] | None = None
) -> Path | None:
    """Write `out` from metrics.jsonl lines; `evaluations` (name -> held-out solve rate, e.g. after warm-up
    and after RL) are drawn as horizontal lines. None when there is nothing to plot yet."""
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [line["step"] for line in lines]
    start = lines[0]["time"] - lines[0].get("step_s", 0.0)
    minutes = [(line["time"] - start) / 60 for line in lines]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x, label in ((axes[0], steps, "training step"), (axes[1], minutes, "wall-clock minutes of RL")):
        ax.plot(x, [line["reward_mean"] for line in lines], label="reward (batch mean)", color="tab:blue")
        ax.plot(x, [line["solve_rate"] for line in lines], label="solve rate (trained groups)", color="tab:green")
        if all("drawn_solve_rate" in line for line in lines):  # dynamic sampling leaves groups out of the batch
            ax.plot(
                x, [line["drawn_solve_rate"] for line in lines], label="solve rate (every episode)", color="tab:orange"
            )
        for (name, value), style in zip((evaluations or {}).items(), ("--", ":", "-."), strict=False):
            ax.axhline(value, linestyle=style, color="gray", label=f"held-out solve rate {name}: {value:.2f}")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward / solve rate")
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].legend(loc="lower right", fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
