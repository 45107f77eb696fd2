"""The exceptions pcgroups raises: one base class, a few specific kinds callers branch on."""

from __future__ import annotations


class PCGroupsError(Exception):
    """Base class of every error pcgroups raises."""


class ConfigError(PCGroupsError, ValueError):
    """A consumer group config (or an argument that builds one) is invalid."""


class NotFoundError(PCGroupsError):
    """A stream, group, bucket or consumer does not exist."""


class GroupExistsError(PCGroupsError):
    """A group exists already with a different config."""


class NotAMemberError(PCGroupsError):
    """The member is not in the group's current membership."""


class ConfigChangedError(PCGroupsError):
    """A running instance saw its group's config change in a way it cannot follow."""


class ConsumerGoneError(PCGroupsError):
    """The member's consumer (or its stream) was deleted under a running instance."""


class SupersededError(PCGroupsError):
    """A double ack (``Msg.ack_sync``) of a message the consumer was RESET past or back over: it is no
    longer pending on the server, so it was not acked (nor answered); it comes again if the new position
    is at or before it."""


class JetStreamAPIError(PCGroupsError):
    """A JetStream API request answered with an error."""

    def __init__(self, description: str, *, code: int = 0, err_code: int = 0, subject: str = ""):
        super().__init__(description)
        self.description = description
        self.code = code
        self.err_code = err_code
        self.subject = subject

    def __str__(self) -> str:
        if self.err_code:
            return f"{self.description} (status {self.code}, error {self.err_code})"
        return self.description


class PermissionDeniedError(PCGroupsError):
    """The server refused a publish or subscription: the user lacks the permission (docs/SECURITY.md)."""

    def __init__(self, message: str, *, operation: str, subject: str):
        super().__init__(message)
        self.operation = operation
        self.subject = subject


def extra_missing(error: ModuleNotFoundError, what: str, extra: str) -> ModuleNotFoundError:
    """``error`` (a package of one of pcgroups' extras is not installed) as one that says what to install."""
    return ModuleNotFoundError(
        f"{what} needs the {extra} extra, which is not installed (no module named "
        f"{error.name!r}): pip install 'pcgroups[{extra}]'",
        name=error.name,
    )
