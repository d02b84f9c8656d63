"""Publishing new weights to the rollout servers: inline in sync mode (the servers are idle anyway),
in a background thread in async mode so training continues while the upload runs."""

from __future__ import annotations

import threading
import time

from kuberl_trainer.rollout_client import RolloutClient


class WeightPublisher:
    def __init__(self, client: RolloutClient, background: bool) -> None:
        self.client, self.background = client, background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_seconds = 0.0  # of the latest finished upload
        self.latest: tuple[int, list[bytes]] | None = None  # kept for servers that come back without it

    def publish(self, version: int, buckets: list[bytes]) -> None:
        self.wait()  # versions arrive in order: one upload at a time
        self.latest = (version, buckets)
        if not self.background:
            self._upload(version, buckets)
            self.wait()
            return
        self._thread = threading.Thread(target=self._upload, args=(version, buckets), daemon=True)
        self._thread.start()

    def _upload(self, version: int, buckets: list[bytes]) -> None:
        started = time.monotonic()
        try:
            self.client.publish(version, buckets)
        except BaseException as err:  # raised in the training loop by wait()
            self._error = err
        self.last_seconds = time.monotonic() - started

    def catch_up(self, server: int) -> None:
        """Give a server that came back (with its initial weights) the latest published version."""
        self.wait()
        if self.latest is not None:
            self.client.catch_up(server, *self.latest)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
