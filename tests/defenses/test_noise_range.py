"""Every noise scale from 0 to ∞ either accounts or is refused when the chain is built."""

from __future__ import annotations

import math

import pytest

from fedleak.defenses import DefenseChain, create_defense
from fedleak.defenses.accounting import (
    LARGEST_ACCOUNTED_NOISE_MULTIPLIER,
    SMALLEST_NOISE_MULTIPLIER,
    AccountingError,
    accounted,
    epsilon,
    make_accountant,
    record,
)
from fedleak.defenses.defense_registry import DefenseConfigError
from fedleak.defenses.mechanism import DeclarationError
from fedleak.harness.remote_defense.declaration import mechanism_from_pb
from fedleak.v1 import defense_pb2 as dpb

SCALES = ("0", "1e-300", "1e-200", "1e-101", "2e-100", "1e-20", "1", "1e3", "1e8", "1e36",
          "1e37", "inf", "nan", "-1")


def _refusal_or_epsilon(chain: list[tuple[str, dict[str, str]]]) -> str:
    try:
        built = DefenseChain([create_defense(name, params) for name, params in chain])
    except DefenseConfigError as err:
        return f"refused: {err}"
    account = built.accountant
    if account.update is not None:
        got = account.rounds()
    elif account.per_example is not None:
        got = account.local_training(64, 8, 1, 8)
    else:
        return "no accounting"
    return f"epsilon {float(got['epsilon_total'])}"


@pytest.mark.parametrize("scale", SCALES)
def test_update_noise_accounts_or_is_refused_by_name(scale: str) -> None:
    out = _refusal_or_epsilon([("clip", {"max-norm": "1"}), ("noise", {"sigma": scale})])
    value = float(scale)
    if out == "no accounting":  # sigma 0: no noise declared, nothing to account
        assert value == 0
    elif out.startswith("epsilon"):
        eps = float(out.split()[1])
        assert eps >= 0 and not math.isnan(eps)
        assert value == 0 or value / 2 >= SMALLEST_NOISE_MULTIPLIER
    else:
        assert out.startswith("refused"), out
        if 0 < value < SMALLEST_NOISE_MULTIPLIER:
            assert "at least 2e-100" in out and "or 0 for no noise" in out


@pytest.mark.parametrize("scale", ["1e-300", "1e-101", "1e-100", "0"])
def test_dpsgd_noise_multiplier_is_checked_at_start(scale: str) -> None:
    out = _refusal_or_epsilon([("dpsgd", {"noise-multiplier": scale})])
    if float(scale) and float(scale) < SMALLEST_NOISE_MULTIPLIER:
        assert "use at least 1e-100" in out, out
    else:
        assert out.startswith("epsilon"), out


def test_a_huge_noise_is_accounted_at_the_cap_as_an_upper_bound() -> None:
    chain = DefenseChain([create_defense("clip", {"max-norm": "1"}),
                          create_defense("noise", {"sigma": "1e30"})])
    got = chain.accountant.rounds()
    assert float(got["noise_multiplier"]) == LARGEST_ACCOUNTED_NOISE_MULTIPLIER
    assert float(got["noise_multiplier_declared"]) == pytest.approx(5e29)
    assert "upper bound" in got["epsilon_note"]


def test_a_remote_declaration_of_underflowing_noise_is_refused() -> None:
    claim = dpb.GaussianClaim(clip_norm=1.0, noise_std=1e-300)
    with pytest.raises(DeclarationError, match="at least 2e-100"):
        accounted(mechanism_from_pb(claim))


def test_a_numeric_failure_of_the_accountant_is_named() -> None:
    accountant = make_accountant("rdp")
    record(accountant, 1e-300, 1.0, 3)  # behind the start check: the guard still names it
    with pytest.raises(AccountingError, match="could not compute ε.*z = 1e-300"):
        epsilon(accountant, 1e-5)
