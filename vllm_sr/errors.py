"""The exception tree. Every error has a stable code, an HTTP status and says whether a retry
can help. Library code raises these; only ``cli.py`` turns them into exit codes."""

from __future__ import annotations

from typing import Any

# Process exit codes (documented in docs/exit-codes.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # refused or failed; a worker exiting 1 is restarted
EXIT_USAGE = 2  # bad command line (argparse's own code)
EXIT_NOT_RUNNING = 3  # the control socket has no service behind it
EXIT_DO_NOT_RESTART = 78  # sysexits EX_CONFIG: bad artifact, failed golden check, bad config


class VllmSrError(Exception):
    """Base of every error vllm-sr raises on purpose."""

    code: str = "internal_error"
    http_status: int = 500
    retryable: bool = False
    exit_code: int = EXIT_FAILURE

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidRequest(VllmSrError):
    code = "invalid_request"
    http_status = 400


class MaxLengthExceeded(InvalidRequest):
    code = "max_length_exceeded"


class ModelNotFound(VllmSrError):
    code = "model_not_found"
    http_status = 404


class NotFound(VllmSrError):
    code = "not_found"
    http_status = 404


class EngineMode(NotFound):
    """A Router-mode surface (chat completions, the Responses API, the routing eval) asked of a
    service in Engine mode (``serve -e``). Here, not in the router, so that Engine mode answers
    it without importing the router."""

    code = "engine_mode"

    @classmethod
    def at(cls, path: str) -> EngineMode:
        """The error for a request to ``path``: the message names the path asked for."""
        return cls(
            f"{path} is not served: it is a Router-mode surface and the service runs in Engine "
            "mode (serve -e); accepted: the native surfaces /v1/embeddings, /v1/classify, "
            "/v1/bundle, or restart without -e for Router mode"
        )


class MethodNotAllowed(VllmSrError):
    """The path exists but not for this method; ``details["allowed"]`` lists those it takes."""

    code = "method_not_allowed"
    http_status = 405


class Forbidden(VllmSrError):
    code = "forbidden"
    http_status = 403


class Conflict(VllmSrError):
    code = "conflict"
    http_status = 409


class RequestTooLarge(VllmSrError):
    code = "request_too_large"
    http_status = 413


class Overloaded(VllmSrError):
    code = "overloaded"
    http_status = 429
    retryable = True

    def __init__(self, message: str, retry_after_s: float = 1.0, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after_s = retry_after_s


class WorkerFailed(VllmSrError):
    code = "worker_failed"
    http_status = 502
    retryable = True


class NotReady(VllmSrError):
    code = "not_ready"
    http_status = 503
    retryable = True


class Unavailable(VllmSrError):
    code = "unavailable"
    http_status = 503
    retryable = True


class DeadlineExceeded(VllmSrError):
    code = "deadline_exceeded"
    http_status = 504
    retryable = True


class ConfigError(VllmSrError):
    """One or more problems in config.yaml or the host settings; ``problems`` lists them all."""

    code = "invalid_config"
    http_status = 400
    exit_code = EXIT_DO_NOT_RESTART

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]

    def __str__(self) -> str:
        return "\n".join(self.problems)


class UsageError(VllmSrError):
    """A flag combination the CLI refuses (names the flag, the value and the fix)."""

    code = "invalid_usage"
    http_status = 400
    exit_code = EXIT_USAGE


class PlacementError(VllmSrError):
    code = "placement_failed"
    http_status = 409
    exit_code = EXIT_DO_NOT_RESTART


class ArtifactError(VllmSrError):
    """The artifact cannot be resolved or loaded; restarting will not help."""

    code = "artifact_error"
    http_status = 500
    exit_code = EXIT_DO_NOT_RESTART


class GoldenCheckFailed(VllmSrError):
    code = "golden_check_failed"
    http_status = 500
    exit_code = EXIT_DO_NOT_RESTART


class ServiceNotRunning(VllmSrError):
    code = "service_not_running"
    http_status = 503
    exit_code = EXIT_NOT_RUNNING
