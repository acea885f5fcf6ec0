"""The contract's one error family: what a reader raises when a record is not one it can
read faithfully. Each is a ``ValueError`` whose ``str()`` is one line; the orchestrator's
readers turn it into a one-line user message (``orchestrator.common.errors.ContractMismatch``)."""

from __future__ import annotations


class ContractError(ValueError):
    """A value or record breaks its contract (a spec.json it cannot read, a field of the
    wrong type, a required field missing, a record this version cannot write): one line."""


class VersionError(ContractError):
    """A record of a format version this reader does not know (a newer writer)."""


class NotARecord(ContractError):
    """The line is not a record at all (blank, torn, not a JSON object)."""
