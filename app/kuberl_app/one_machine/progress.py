"""The live progress line of `kuberl run`: step, reward, solve rate, tokens/s, staleness, ETA."""

from __future__ import annotations

import sys


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(line: dict, total_steps: int, elapsed: float, seconds_per_step: float | None) -> str:
    """One line from the learner's latest metrics line (pure)."""
    step = line["step"]
    eta = None if seconds_per_step is None else seconds_per_step * max(0, total_steps - step)
    width = 20
    done = int(width * min(step, total_steps) / max(total_steps, 1))
    return (
        f"[{'#' * done}{'.' * (width - done)}] step {step}/{total_steps} | reward {line['reward_mean']:.3f} | "
        f"solve {line.get('drawn_solve_rate', line['solve_rate']):.0%} | {line['tokens_per_s']:.0f} tok/s | "
        f"staleness {line.get('staleness_mean', 0.0):.1f} | {duration(elapsed)} | ETA {duration(eta)}"
    )


class ProgressPrinter:
    """Rewrites one line on a terminal; prints a line per step otherwise (CI logs)."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self._open = False

    def update(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (an event), without breaking the progress line."""
        if self._open:
            self.stream.write("\n")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()
