"""Exceptions of the pglimit client.

Two kinds, because a caller must treat them differently: a
:class:`PglimitProblem` is a mistake in the request (or a missing token) that
retrying will not fix, so it is raised whatever ``on_error`` says; a
:class:`PglimitUnavailable` means pglimit could not decide, and is raised
only when the caller chose ``on_error="raise"`` over failing open or closed.
"""

from __future__ import annotations

from typing import Literal, Optional

__all__ = ["PglimitError", "PglimitProblem", "PglimitUnavailable"]


class PglimitError(Exception):
    """Base class of every exception this client raises, for one ``except``."""


class PglimitProblem(PglimitError):
    """A 4xx answer: an RFC 9457 problem document from pglimit.

    ``type`` is ``urn:pglimit:problem:<kind>`` (e.g. ``invalid-field``,
    ``unknown-policy``, ``unauthorized``); ``field`` names the request field
    at fault when there is one (e.g. ``identifiers.ip``). A 4xx that is not a
    problem document (a proxy's page) gets ``type`` ``about:blank``.
    """

    def __init__(
        self,
        type: str,
        status: int,
        title: str,
        detail: str,
        field: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" + (f" (field {field})" if field else ""))
        self.type = type
        self.status = status
        self.title = title
        self.detail = detail
        self.field = field
        self.request_id = request_id

    @property
    def kind(self) -> str:
        """The part of ``type`` after ``urn:pglimit:problem:``, or ``type`` itself."""
        prefix = "urn:pglimit:problem:"
        return self.type[len(prefix) :] if self.type.startswith(prefix) else self.type


class PglimitUnavailable(PglimitError):
    """pglimit did not decide: timeout, connection error, 5xx or a garbled answer.

    Raised only with ``on_error="raise"``; the underlying exception is
    ``__cause__``. ``problem`` holds pglimit's own problem document when it
    answered 5xx with one (``store-unavailable``, ``request-timeout``).
    """

    def __init__(
        self,
        reason: Literal["timeout", "error"],
        message: str,
        problem: Optional[PglimitProblem] = None,
    ) -> None:
        super().__init__(message)
        self.reason: Literal["timeout", "error"] = reason
        self.problem = problem
