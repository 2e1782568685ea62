"""Secure aggregation (fedleak.defenses.secagg): exact sums, dropouts, Shamir, masking looks
uniform, quantisation bounds, refusals, and the wire format."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from fedleak.defenses.secagg import (
    MODULUS,
    AdvertiseKeys,
    FixedPointQuantizer,
    MaskedInput,
    MaskedInputRequest,
    SecAggAbort,
    SecAggConfig,
    SecAggServer,
    SecAggUser,
    SecAggViolation,
    ShamirError,
    Share,
    ShareKeys,
    ShareKeysRequest,
    UnmaskingRequest,
    UnmaskingShares,
    decode_message,
    prg,
    run_secagg_in_memory,
    shamir,
)

D = 1000
CLIP = 1.0


def make_inputs(n: int, seed: int = 0, scale: float = 0.3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, scale, D).astype(np.float32) for _ in range(n)]


def quantized_sum(inputs: list[np.ndarray], ids: tuple[int, ...], n: int) -> np.ndarray:
    quantizer = FixedPointQuantizer(CLIP, n)
    total = np.zeros(D, dtype=np.uint32)
    for u in ids:
        total += quantizer.quantize(inputs[u])
    return total


def clipped_sum(inputs: list[np.ndarray], ids: tuple[int, ...]) -> np.ndarray:
    return np.sum([np.clip(inputs[u].astype(np.float64), -CLIP, CLIP) for u in ids], axis=0)


def start(n: int = 5, t: int = 3, seed: int = 1):
    """Users and server after Round 1: returns (config, users, server, routed requests)."""
    config = SecAggConfig(threshold=t, clip=CLIP, vector_length=D, num_users=n)
    streams = np.random.default_rng(seed).spawn(n)
    users = [SecAggUser(u, config, rng=streams[u]) for u in range(n)]
    server = SecAggServer(config)
    request = server.advertise_keys(u.advertise_keys() for u in users)
    routed = server.share_keys(u.share_keys(request) for u in users)
    return config, users, server, routed


# --- the sum ----------------------------------------------------------------------------------


def test_sum_without_dropouts_is_exact_and_pairwise_masks_cancel() -> None:
    inputs = make_inputs(6)
    total, transcript = run_secagg_in_memory(inputs, threshold=4, clip=CLIP, rng=7)
    result = transcript.result
    everyone = tuple(range(6))
    assert transcript.u1 == transcript.u2 == transcript.u3 == transcript.u5 == everyone
    expected = quantized_sum(inputs, everyone, 6)
    np.testing.assert_array_equal(result.quantized_total, expected)
    # Sum of y_u mod 2^32: the pairwise masks cancel, only the self-masks PRG(b_u) remain.
    masked_sum = np.zeros(D, dtype=np.uint32)
    for y in transcript.masked_inputs.values():
        masked_sum += y
    for seed in result.self_mask_seeds.values():
        masked_sum -= prg.expand(seed, D)
    np.testing.assert_array_equal(masked_sum, expected)
    bound = transcript.config.quantizer.error_bound(6)
    assert np.max(np.abs(total - clipped_sum(inputs, everyone))) <= bound
    assert bound < 1e-7


@pytest.mark.parametrize("dropped", [{7}, {0, 4}, {1, 2, 6}])
def test_users_dropping_after_masking_stay_in_the_sum(dropped: set[int]) -> None:
    inputs = make_inputs(8, seed=2)
    total, transcript = run_secagg_in_memory(inputs, 5, CLIP, drop_after_masking=dropped, rng=3)
    everyone = tuple(range(8))
    assert transcript.u3 == everyone
    assert transcript.u5 == tuple(u for u in everyone if u not in dropped)
    np.testing.assert_array_equal(transcript.result.quantized_total,
                                  quantized_sum(inputs, everyone, 8))
    assert np.max(np.abs(total - clipped_sum(inputs, everyone))) <= (
        transcript.config.quantizer.error_bound(8))


@pytest.mark.parametrize("dropped", [{3}, {0, 6}, {2, 4, 5}])
def test_users_dropping_before_masking_are_excluded(dropped: set[int]) -> None:
    inputs = make_inputs(7, seed=4)
    total, transcript = run_secagg_in_memory(inputs, 4, CLIP, drop_before_masking=dropped, rng=5)
    survivors = tuple(u for u in range(7) if u not in dropped)
    assert transcript.u2 == tuple(range(7))
    assert transcript.u3 == survivors
    assert transcript.result.dropped == tuple(sorted(dropped))
    assert set(transcript.result.mask_keys) == dropped  # s_v^SK rebuilt to strip their masks
    np.testing.assert_array_equal(transcript.result.quantized_total,
                                  quantized_sum(inputs, survivors, 7))
    assert np.max(np.abs(total - clipped_sum(inputs, survivors))) <= (
        transcript.config.quantizer.error_bound(len(survivors)))


def test_dropouts_at_every_round_together() -> None:
    inputs = make_inputs(8, seed=6)
    _, transcript = run_secagg_in_memory(
        inputs, 5, CLIP, drop_before_sharing={1}, drop_before_masking={4}, drop_after_masking={6},
        rng=8,
    )
    assert transcript.u1 == tuple(range(8))
    assert transcript.u2 == (0, 2, 3, 4, 5, 6, 7)
    assert transcript.u3 == (0, 2, 3, 5, 6, 7)
    assert transcript.u5 == (0, 2, 3, 5, 7)
    np.testing.assert_array_equal(transcript.result.quantized_total,
                                  quantized_sum(inputs, transcript.u3, 8))


@pytest.mark.parametrize(
    "drops",
    [
        {"drop_before_sharing": {0, 1, 2}},
        {"drop_before_masking": {0, 3, 4}},
        {"drop_after_masking": {1, 2, 3}},
        {"drop_before_masking": {0, 1}, "drop_after_masking": {2}},
    ],
)
def test_fewer_than_threshold_users_aborts(drops: dict[str, set[int]]) -> None:
    with pytest.raises(SecAggAbort, match="threshold t=3"):
        run_secagg_in_memory(make_inputs(5), 3, CLIP, rng=9, **drops)


def test_secagg_with_real_randomness() -> None:
    inputs = make_inputs(5, seed=10)
    total, transcript = run_secagg_in_memory(inputs, 3, CLIP, drop_before_masking={2})
    assert np.max(np.abs(total - clipped_sum(inputs, transcript.u3))) <= (
        transcript.config.quantizer.error_bound(4))


# --- Shamir -----------------------------------------------------------------------------------


def test_any_t_shares_reconstruct_and_t_minus_1_do_not() -> None:
    secret = bytes(3) + bytes(range(29))  # leading zero bytes must survive
    t, n = 3, 6
    shares = shamir.split(secret, t, n)
    for subset in itertools.combinations(shares, t):
        assert shamir.combine(list(subset)) == secret
    assert shamir.combine(shares) == secret
    target = int.from_bytes(b"\x01" + secret, "big")
    for subset in itertools.combinations(shares, t - 1):
        with pytest.raises(ShamirError, match="need 3 distinct shares"):
            shamir.combine(list(subset))
        assert shamir.interpolate_at_zero([(s.x, s.y) for s in subset]) != target


def test_t_minus_1_shares_are_consistent_with_any_secret() -> None:
    shares = shamir.split(b"the real secret", 3, 5)
    known = [(s.x, s.y) for s in shares[:2]]  # t - 1 = 2 shares
    forged_secret = int.from_bytes(b"\x01" + b"any other secret", "big")
    points = [(0, forged_secret), *known]
    # The degree-2 polynomial through (0, forged) and the two real shares, evaluated at x = 3.
    y3 = 0
    for i, (x_i, y_i) in enumerate(points):
        term = y_i
        for j, (x_j, _) in enumerate(points):
            if j != i:
                term = term * (3 - x_j) * pow(x_i - x_j, -1, shamir.PRIME) % shamir.PRIME
        y3 = (y3 + term) % shamir.PRIME
    completed = [*shares[:2], Share(3, y3, 3)]
    assert shamir.combine(completed) == b"any other secret"


def test_shamir_refuses_inconsistent_or_foreign_shares() -> None:
    a = shamir.split(b"a" * 32, 2, 3)
    b = shamir.split(b"b" * 32, 3, 3)
    with pytest.raises(ShamirError, match="different splits"):
        shamir.combine([a[0], b[1], b[2]])
    with pytest.raises(ShamirError, match="two different shares"):
        shamir.combine([a[0], replace(a[0], y=a[0].y ^ 1), a[1]])
    with pytest.raises(ShamirError, match="at most 64"):
        shamir.split(bytes(65), 2, 3)


# --- what the server sees ---------------------------------------------------------------------


def test_one_masked_vector_looks_uniform_while_the_quantised_input_does_not() -> None:
    inputs = make_inputs(5, seed=11)
    _, transcript = run_secagg_in_memory(inputs, 3, CLIP, rng=12)
    y = transcript.masked_inputs[2]
    q = transcript.config.quantizer.quantize(inputs[2])
    assert stats.kstest(y / MODULUS, "uniform").pvalue > 1e-3
    assert stats.kstest(q / MODULUS, "uniform").pvalue < 1e-10
    top_bits = np.bincount(y >> 28, minlength=16)
    assert stats.chisquare(top_bits).pvalue > 1e-3
    assert stats.chisquare(np.bincount(q >> 28, minlength=16)).pvalue < 1e-10
    assert abs(np.corrcoef(transcript.masked_update(2), inputs[2])[0, 1]) < 0.15


# --- quantisation -----------------------------------------------------------------------------


@pytest.mark.parametrize("users, clip", [(1, 1.0), (5, 0.01), (8, 3.0), (1000, 1.0)])
def test_dequantisation_error_within_bound(users: int, clip: float) -> None:
    quantizer = FixedPointQuantizer(clip, users)
    rng = np.random.default_rng(users)
    xs = rng.uniform(-clip, clip, size=(users, 200))
    total = np.zeros(200, dtype=np.uint32)
    for x in xs:
        total += quantizer.quantize(x)
    error = np.abs(quantizer.dequantize_sum(total, users) - xs.sum(axis=0))
    assert error.max() <= quantizer.error_bound(users)
    assert quantizer.error_bound(users) == pytest.approx(users * clip / quantizer.levels, rel=1e-4)


def test_values_outside_the_clip_range_are_clipped_and_k_users_never_wrap() -> None:
    quantizer = FixedPointQuantizer(1.0, 8)
    x = np.array([-50.0, -1.0, -0.25, 0.0, 0.5, 1.0, 7.0])
    back = quantizer.dequantize_sum(quantizer.quantize(x), 1)
    np.testing.assert_allclose(back, np.clip(x, -1, 1), atol=quantizer.error_bound(1))
    top = quantizer.quantize(np.full(3, 9.0))
    assert int(top[0]) * 8 <= MODULUS - 1  # 8 users at +c sum without wrapping
    total = np.zeros(3, dtype=np.uint32)
    for _ in range(8):
        total += top
    np.testing.assert_allclose(quantizer.dequantize_sum(total, 8), 8.0, atol=1e-7)
    with pytest.raises(ValueError, match="NaN"):
        quantizer.quantize(np.array([0.0, np.nan]))


# --- refusals ---------------------------------------------------------------------------------


def test_tampered_ciphertext_is_rejected_and_the_user_can_go_on() -> None:
    _, users, _, routed = start()
    request = routed[1]
    tampered = dict(request.ciphertexts)
    blob = bytearray(tampered[3])
    blob[20] ^= 0x01
    tampered[3] = bytes(blob)
    x = make_inputs(1)[0]
    with pytest.raises(SecAggViolation, match="AES-GCM tag"):
        users[1].masked_input_collection(MaskedInputRequest(1, tampered), x)
    # A ciphertext from user 3 relabelled as coming from user 4 fails its tag too.
    swapped = dict(request.ciphertexts)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    with pytest.raises(SecAggViolation, match="AES-GCM tag"):
        users[1].masked_input_collection(MaskedInputRequest(1, swapped), x)
    with pytest.raises(SecAggViolation, match="delivered to user 1"):
        users[1].masked_input_collection(routed[2], x)
    assert users[1].masked_input_collection(request, x).masked.shape == (D,)


def test_user_refuses_to_reveal_both_shares_of_one_peer() -> None:
    _, users, server, routed = start()
    x = make_inputs(5)
    masked = [u.masked_input_collection(routed[u.user_id], x[u.user_id]) for u in users[:4]]
    honest = server.masked_input_collection(masked)
    assert honest == UnmaskingRequest((0, 1, 2, 3), (4,))
    with pytest.raises(SecAggViolation, match=r"both .* users \[2\]"):
        users[0].unmasking(UnmaskingRequest((0, 1, 2, 3), (2, 4)))
    users[0].unmasking(honest)
    # Having sent b-shares for 0..3, user 0 will not now send the s^SK share of user 3.
    with pytest.raises(SecAggViolation, match=r"both .* users \[3\]"):
        users[0].unmasking(UnmaskingRequest((0, 1, 2), (3, 4)))
    with pytest.raises(SecAggViolation, match="lists as dropped"):
        users[1].unmasking(UnmaskingRequest((0, 2, 3), (1, 4)))
    assert users[1].unmasking(honest).user_id == 1


def test_server_refuses_messages_that_do_not_fit_the_round() -> None:
    _, users, server, routed = start()
    x = make_inputs(5)
    masked = [u.masked_input_collection(routed[u.user_id], x[u.user_id]) for u in users]
    bad = MaskedInput(0, masked[0].masked[:-1])
    with pytest.raises(SecAggViolation, match="user 0 must send a uint32 vector of length 1000"):
        server.masked_input_collection([bad, *masked[1:]])
    with pytest.raises(SecAggViolation, match="two messages from user 1"):
        server.masked_input_collection([*masked, masked[1]])
    request = server.masked_input_collection(masked)  # the state was not changed by refusals
    assert request.survivors == (0, 1, 2, 3, 4)


def test_server_detects_a_wrong_mask_key_share() -> None:
    _, users, server, routed = start()
    x = make_inputs(5)
    request = server.masked_input_collection(
        u.masked_input_collection(routed[u.user_id], x[u.user_id]) for u in users[:4]
    )
    answers = [u.unmasking(request) for u in users[:4]]
    share = answers[0].mask_key_shares[4]
    answers[0] = replace(answers[0], mask_key_shares={4: replace(share, y=share.y ^ 1)})
    with pytest.raises(SecAggViolation, match="user 4|s_4"):
        server.unmasking(answers)


# --- wire format ------------------------------------------------------------------------------


def test_every_message_round_trips_through_bytes() -> None:
    _, users, server, routed = start()
    x = make_inputs(5)
    advertised = users[0].advertise_keys()
    share_keys = server.transcript.share_keys[2]
    masked = users[3].masked_input_collection(routed[3], x[3])
    for u in (0, 1, 2, 4):
        users[u].masked_input_collection(routed[u], x[u])
    unmask = UnmaskingRequest((0, 1, 2, 3), (4,))
    shares = users[2].unmasking(unmask)
    request = ShareKeysRequest(tuple(server.transcript.advertised.values()))
    for message in (advertised, request, share_keys, routed[1], unmask, shares):
        data = message.to_bytes()
        assert type(message).from_bytes(data) == message
        assert decode_message(data) == message
        assert b"pickle" not in data and not data.startswith(b"\x80")
    back = MaskedInput.from_bytes(masked.to_bytes())
    assert back.user_id == 3 and back.masked.dtype == np.uint32
    np.testing.assert_array_equal(back.masked, masked.masked)
    assert isinstance(shares.self_mask_shares[0], Share)
    assert isinstance(decode_message(share_keys.to_bytes()), ShareKeys)
    assert isinstance(decode_message(shares.to_bytes()), UnmaskingShares)


def test_malformed_bytes_are_refused() -> None:
    data = AdvertiseKeys(1, bytes(32), bytes(range(32))).to_bytes()
    with pytest.raises(SecAggViolation, match="truncated"):
        AdvertiseKeys.from_bytes(data[:-1])
    with pytest.raises(SecAggViolation, match="trailing"):
        AdvertiseKeys.from_bytes(data + b"\x00")
    with pytest.raises(SecAggViolation, match="expected a ShareKeys message"):
        ShareKeys.from_bytes(data)
    with pytest.raises(SecAggViolation, match="not a secure-aggregation message"):
        decode_message(b"GARBAGE!")
    huge = MaskedInput(0, np.zeros(4, dtype=np.uint32)).to_bytes()
    with pytest.raises(SecAggViolation, match="truncated"):
        MaskedInput.from_bytes(huge[:10] + (2**40).to_bytes(8, "little") + huge[18:])


def test_prg_is_deterministic_aes256_ctr() -> None:
    seed = bytes(range(32))
    np.testing.assert_array_equal(prg.expand(seed, 100), prg.expand(seed, 100))
    np.testing.assert_array_equal(prg.expand(seed, 10), prg.expand(seed, 100)[:10])
    assert not np.array_equal(prg.expand(seed, 100), prg.expand(bytes(32), 100))
    # AES-256 of the all-zero block under the all-zero key (FIPS-197 style known answer).
    assert prg.expand(bytes(32), 4).astype("<u4").tobytes().hex() == (
        "dc95c078a2408989ad48a21492842087")


def test_config_refuses_unsafe_parameters() -> None:
    with pytest.raises(ValueError, match="threshold"):
        SecAggConfig(threshold=1, clip=1.0, vector_length=10, num_users=5)
    with pytest.raises(ValueError, match="threshold"):
        SecAggConfig(threshold=6, clip=1.0, vector_length=10, num_users=5)
    with pytest.raises(ValueError, match="clip"):
        SecAggConfig(threshold=3, clip=0.0, vector_length=10, num_users=5)
