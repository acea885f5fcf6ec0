"""dfo's contract: the small, torch-free, stdlib-only package that both sides import.

The orchestrator (local side and supervisor) and the trainer never import each other;
everything they must agree on lives here:

``fsio``            atomic writes, directory replacement, JSON-lines files, sha256, directory
                    fsync (each helper exists once)
``procs``           /proc/PID/stat, and liveness checks that a reused pid does not fool
``markers``         the ``@dfo `` output-marker format and the "last JSON line" reply parser
``exitcodes``       the trainer's exit-code table and the errors that map onto it
``checkpoints``     checkpoint manifests: verify ``step_N`` dirs, lineage, newest valid
``faultspec``       the fault-injection spec (``DFO_FAULT`` / ``--fault.spec``) parser
``trainer_config``  the trainer's config tree (kw_only dataclasses) and its flag parser
``envvars``         the names of the environment variables the supervisor sets
``runspec``         spec.json: the versioned RunSpec launch hands the supervisor (``runlimits``:
                    its Thresholds and Budget)
``codec``           the one codec of the records that cross a process (dataclass <-> JSON)
``runstate``        a run directory's file names and ``state.json`` (RunState, Attempt; its
                    parts: ``state_records``)
``replies``         remote helpers' replies (launch probe, launch steps, warm-up report,
                    TensorBoard, port probe, deploy lease owner)
``status``          what ``dfo status``/``dfo stop`` read from a host (RunStatus, QueryReply,
                    StopReply); ``goodput``: a run's time account (Goodput)
``events``          ``events.jsonl``'s typed records (kinds: ``events.kinds``; rules: ``events.base``)
``wire``            the records ``dfo logs`` reads from the host's follower
``errors``          ContractError (VersionError, NotARecord): a record a reader cannot trust
"""
