"""The supervisor's thresholds as a user gives them (``dfo launch --threshold K=V``, a run
file's ``thresholds:``): validated into the one ``Thresholds`` class of spec.json. Pure."""

from __future__ import annotations

from typing import Any, Mapping

from dfo_contract.errors import ContractError
from dfo_contract.runlimits import Thresholds

from ..common.errors import ConfigError


def thresholds(overrides: Mapping[str, Any] | None = None) -> Thresholds:
    """The defaults with ``overrides``; ConfigError (one line) for an unknown name or a value
    that is not a positive number (0 only where it means "off")."""
    try:
        return Thresholds.from_user(dict(overrides or {}), "--threshold")
    except ContractError as e:
        raise ConfigError(str(e), hint="known: " + ", ".join(Thresholds.names())) from None
