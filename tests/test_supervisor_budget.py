"""Restart budgets and backoff (pure, times injected)."""

from __future__ import annotations

import pytest

from orchestrator.common.errors import ConfigError
from orchestrator.common.budget import BudgetPolicy, BudgetState, backoff, on_failure


def test_backoff_doubles_and_caps():
    p = BudgetPolicy()
    assert [backoff(p, i) for i in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff(BudgetPolicy(scale=0.01), 2) == pytest.approx(0.2)


def test_per_class_budget_is_spent():
    p = BudgetPolicy(per_class={"crash": 2}, total=10)
    s = BudgetState()
    d = [on_failure(p, s, "crash", healthy_s=0, startup=False) for _ in range(3)]
    assert [x.restart for x in d] == [True, True, False]
    assert "crash spent (2)" in d[-1].reason


def test_total_budget_is_spent():
    p = BudgetPolicy(per_class={"crash": 5, "oom": 5}, total=3)
    s = BudgetState()
    r = [on_failure(p, s, c, healthy_s=0, startup=False).restart
         for c in ("crash", "oom", "crash", "oom")]
    assert r == [True, True, True, False]


def test_healthy_period_resets_backoff_and_transient_counts():
    p = BudgetPolicy(per_class={"crash": 2}, total=100)
    s = BudgetState()
    on_failure(p, s, "crash", healthy_s=0, startup=False)
    d2 = on_failure(p, s, "crash", healthy_s=0, startup=False)
    assert d2.delay == 20
    d3 = on_failure(p, s, "crash", healthy_s=601, startup=False)
    assert d3.restart and d3.delay == 10 and s.counts["crash"] == 1


def test_startup_failures_do_not_loop():
    p = BudgetPolicy(per_class={"crash": 50}, total=100, startup_limit=3)
    s = BudgetState()
    r = [on_failure(p, s, "crash", healthy_s=0, startup=True).restart for _ in range(3)]
    assert r == [True, True, False]
    # a changed config starts a new streak
    s2 = BudgetState()
    on_failure(p, s2, "crash", healthy_s=0, startup=True)
    on_failure(p, s2, "crash", healthy_s=0, startup=True)
    assert on_failure(p, s2, "crash", healthy_s=0, startup=True,
                      same_config_as_last_startup_failure=False).restart


def test_permanent_errors_never_restart():
    d = on_failure(BudgetPolicy(), BudgetState(), "crash", healthy_s=0, startup=True,
                   permanent=True)
    assert not d.restart


def test_policy_roundtrip_and_validation():
    p = BudgetPolicy.from_user({"per_class": {"oom": 1}, "scale": 0.5, "total": 4})
    assert p.per_class["oom"] == 1 and p.per_class["crash"] == 3
    assert BudgetPolicy.from_user(p.to_json()) == p
    with pytest.raises(ConfigError):
        BudgetPolicy.from_user({"per_class": {"bogus": 1}})
    with pytest.raises(ConfigError):
        BudgetPolicy.from_user({"scale": 0})


def test_a_new_fallback_waits_only_the_settle_time():
    from orchestrator.common.budget import Decision, restart_delay

    p = BudgetPolicy()
    dec = Decision(True, 40.0, "restart 3/5")
    # a ladder step changed the config: backing off cannot help a deterministic failure
    assert restart_delay(p, dec, "fx_trace_race", config_changed=True) == 0.5
    assert restart_delay(p, dec, "oom", config_changed=True) == 0.5
    # the same config again, or a transient class: the full backoff
    assert restart_delay(p, dec, "fx_trace_race", config_changed=False) == 40.0
    assert restart_delay(p, dec, "nccl_timeout", config_changed=True) == 40.0
    # scaled like every duration, and never longer than the backoff itself
    assert restart_delay(BudgetPolicy(scale=0.1), dec, "oom", config_changed=True) == \
        pytest.approx(0.05)
    assert restart_delay(p, Decision(True, 0.2, "x"), "oom", config_changed=True) == 0.2
