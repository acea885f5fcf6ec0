class ContractError(ValueError):
    """A value that breaks one of dfo's contracts (a spec.json it cannot read, ...): one line."""
