"""Errors a KubeRL server answers with: the HTTP status and a message that says what to do."""

from __future__ import annotations


class ServiceError(Exception):
    """A request that cannot be served; `status` is the HTTP status to answer with, str() the reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
