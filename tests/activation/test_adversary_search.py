"""A randomized adversary search over the real ``ActivationCore`` (``adversary.py``).

Properties, judged over [600 s, 3,600 s) of each simulated hour against the same honest world with
no attacker (the control):

(a) the learner is fed: the completions it accepts from anyone (attackers' real deliveries count)
    are at least ``FED`` of the control's. A loss above 20% is a high finding (red team severity);
    below it, a medium one, which the README lists;
(b) the attacker's Activates (new trials and re-activations, each a weight fetch) stay within
    ``ACTIVATES_PER_IDENTITY`` per identity it used, plus the 124 an hour trial tokens allow.

The default suite runs the programs the search shrank its findings to (red team round 18) and a
few random programs; ``pytest -m slow tests/activation/test_adversary_search.py`` runs 400.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from tests.activation.adversary import Move, Outcome, random_program, simulate

FED = 0.8
ACTIVATES_PER_IDENTITY = 30


@cache
def control(world: str) -> Outcome:
    return simulate(world, ())


def check(world: str, program: list[Move]) -> Outcome:
    outcome = simulate(world, program)
    fed = outcome.useful / control(world).useful
    assert fed >= FED, f"{world}: the learner got {fed:.1%} of the control's completions ({outcome})"
    bound = 124 + ACTIVATES_PER_IDENTITY * outcome.identities
    assert outcome.attacker_activates <= bound, f"{world}: {outcome.attacker_activates} Activates > {bound}"
    return outcome


def test_a_fast_link_worker_and_a_needed_slow_link_one_both_work_with_no_attacker() -> None:
    # Round 18 F1 with no attacker: the slow-link worker's own D (41 s) was measured before a
    # window could prove it, and only proven workers could top up: 18,000 of 36,000.
    assert simulate("mixed2", ()).useful == control("fast2").useful


def test_one_proven_identity_meeting_the_latency_rule_does_not_lock_out_slow_link_workers() -> None:
    # F1: one identity delivering 0.5/s at price 0, announcing at once: 1,500 of 36,000.
    program: list[Move] = [(0, "join", 0, 0.5, 0.0, None), (0, "late", 0, 0.0), (0, "deliver", 0, ("claim",))]
    assert simulate("slowreal2", program).useful >= 0.98 * control("slowreal2").useful


def test_a_silent_dearer_claim_never_replaces_a_proven_worker_outside_probation() -> None:
    # F2: ``full`` (the plan among everyone) took the silent claim and dropped a proven worker
    # when probation had no candidate: 22,512 of 36,000.
    program: list[Move] = [(0, "join", 0, 6.0, 2.0, None), (0, "deliver", 0, ("none",))]
    outcome = simulate("slow2", program)
    assert outcome.useful == control("slow2").useful and outcome.honest_deactivates == 0


def test_a_proven_worker_whose_d_was_forgotten_is_rechecked_beside_the_others_not_instead() -> None:
    # Search seed 38, shrunk: two slow-link proven workers took turns (the one whose D was
    # forgotten looked better and replaced the other) and delivered almost nothing: 25,740.
    program: list[Move] = [
        (0, "join", 2, 1.0, 1.0, None),
        (0, "join", 8, 0.5, 2.0, 39.0),
        (0, "late", 8, 1.0),
        (0, "deliver", 8, ("huge", 200)),
        (0, "join", 12, 6.0, 0.5, None),
        (0, "late", 12, 0.0),
        (0, "deliver", 12, ("claim",)),
        (0, "policy", 12, "c115"),
        (0, "join", 13, 100.0, 1.0, 2.0),
        (0, "late", 13, None),
        (0, "deliver", 13, ("real", 0.5)),
    ]
    assert simulate("slowreal2", program).useful >= 0.98 * control("slowreal2").useful


def test_a_proven_identity_whose_d_is_not_measured_yet_does_not_displace_the_proven_workers() -> None:
    # Round 19, D: fresh identities delivering their claim and announcing their weights 49 s late
    # were proven before their D came in and displaced the honest workers, whose first delivery
    # takes 60-90 s, every ~160 s: 52.8% of the completions.
    program: list[Move] = [
        (0, "join", 0, 6.0, 0.0, 45.0),
        (0, "late", 0, 49.0),
        (0, "deliver", 0, ("claim",)),
        (0, "policy", 0, "lap"),
        (275, "readv", 0, 12.0, 0.0, None),
    ]
    assert simulate("first60", program).useful >= 0.9 * control("first60").useful


def test_a_late_proven_identity_kept_by_the_fallback_does_not_keep_out_workers_meeting_the_rule() -> None:
    # Round 19, E: its 12/s covered the need in the fallback plan, so honest workers meeting the
    # rule were never tried (0 honest completions; the staleness gate would drop its rollouts).
    program: list[Move] = [
        (0, "join", 0, 12.0, 0.0, None),
        (0, "late", 0, 49.0),
        (0, "deliver", 0, ("claim",)),
    ]
    outcome = simulate("fast2", program)
    assert outcome.honest >= 0.9 * control("fast2").honest


def test_a_claim_delivering_less_than_the_margin_absorbs_does_not_cover_the_need_alone() -> None:
    # Round 19, B: 12/s claimed, 9/s delivered (inside the 25% drift band, outside the 10%
    # margin): the plan counted 12 and kept every honest worker idle, 75% of the completions.
    program: list[Move] = [(0, "join", 0, 12.0, 0.0, None), (0, "deliver", 0, ("real", 9.0))]
    assert simulate("fast3", program).useful >= 0.95 * control("fast3").useful


def test_a_proven_identity_alternating_between_real_output_and_a_trickle_does_not_starve_it() -> None:
    # Round 20, A: each slowdown was adopted and switched the honest workers on; each recovery,
    # adopted 30 s later, dropped them before their first delivery (60-90 s): 53.7% of the
    # completions, honest workers 0. Flap damping keeps it untrusted until they are proven.
    program: list[Move] = [(0, "join", 0, 12.0, 0.0, None), (0, "late", 0, 1.0)]
    for t in range(0, 3600, 90):
        program += [(t, "deliver", 0, ("real", 12.0)), (t + 45, "deliver", 0, ("real", 1.0))]
    check("first60", program)


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_keep_the_learner_fed(seed: int) -> None:
    check(*random_program(seed))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 406))
def test_random_programs_keep_the_learner_fed_search(seed: int) -> None:
    check(*random_program(seed))


def rotation(period: int, real: int, *, restart_after: int | None = None, readv: bool = False) -> list[Move]:
    """One slot: a fresh price-0 identity every ``period`` s, delivering 12/s for ``real`` s, then
    nothing (red team round 21); ``restart_after``: each restarts that long after going silent,
    ``readv``: each re-advertises 16/s (off its proof) as it goes silent (round 25)."""
    program: list[Move] = [(0, "join", 0, 12.0, 0.0, None)]
    for t in range(0, 3600, period):
        program += [(t, "fresh", 0)] if t else []
        program += [(t, "readv", 0, 12.0, 0.0, None)] if t and readv else []
        program += [(t, "deliver", 0, ("real", 12.0)), (t + real, "deliver", 0, ("none",))]
        if restart_after is not None and t + real + restart_after < 3600:
            program += [(t + real + restart_after, "restart", 0)]
        if readv and t + real < 3600:
            program += [(t + real, "readv", 0, 16.0, 0.0, None)]
    return program


def test_fresh_identities_stalling_just_before_their_drop_is_adopted_do_not_starve_the_learner() -> None:
    # Round 21, F1: each proven identity was trusted at once, stalled after 38 s and was replaced
    # before its silence was adopted; no drop was ever recorded and the cold start never tried
    # the honest workers: 42.7% of the completions in every world, honest workers 0.
    for world in ("fast2", "first60"):
        outcome = check(world, rotation(70, 38))
        assert outcome.useful >= 0.95 * control(world).useful and outcome.honest > 0


def test_one_fresh_identity_per_slowdown_does_not_escape_flap_damping() -> None:
    # Round 21, F2: damping was per identity, so each fresh one started undamped: 72.8%.
    outcome = check("first60", rotation(250, 190))
    assert outcome.useful >= 0.95 * control("first60").useful


def test_proven_identities_banked_idle_are_not_trusted_again_when_re_activated() -> None:
    # Round 22: 24 price-0 identities proven early on their real 12/s, idle while a cheaper one
    # covered the need, all silent from 600 s: each was re-activated trusted when the last one
    # stalled and covered the need alone until measured at 0 (~150 s each): 0% in every world.
    program: list[Move] = []
    for k in range(24):
        program += [(10 * k, "join", k, 12.0 + 0.1 * k, 0.0, None), (10 * k, "deliver", k, ("claim",))]
        program += [(600, "deliver", k, ("none",))]
    outcome = check("first60", program)
    assert outcome.useful >= 0.9 * control("first60").useful and outcome.honest > 0
    check("new2", program)  # a newcomer's world: 81.7% (README, Known limits)


def test_a_proven_identity_restarting_at_full_rate_is_a_drop_and_the_cold_start_hedges() -> None:
    # Round 23, F1: one price-0 identity claiming the whole need (11/s), really delivering 10.5/s,
    # restarted (new address) every 300 s at full rate and stayed silent 117 s, just under
    # first_rollout_timeout. No drop and no failed claim were recorded, so each restart was a cold
    # start that tried its claim alone: 53.4% of the completions in every world, honest workers 0.
    program: list[Move] = [(0, "join", 0, 11.0, 0.0, None), (0, "deliver", 0, ("real", 10.5))]
    for t in range(189, 3600, 300):
        program += [(t, "restart", 0), (t, "deliver", 0, ("none",)), (t + 117, "deliver", 0, ("real", 10.5))]
    for world in ("fast2", "first60", "rst2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.95 * control(world).useful and outcome.honest > 0


def truthful_small_claims(count: int, *, silent_from: int) -> list[Move]:
    """``count`` price-0 identities joining 4 s apart, each delivering its claim of about 1/s, all
    silent from ``silent_from`` (red team round 23)."""
    program: list[Move] = []
    for k in range(count):
        program += [(4 * k, "join", k, 1.0 + 0.01 * k, 0.0, None), (4 * k, "deliver", k, ("claim",))]
        program += [(silent_from, "deliver", k, ("none",))]
    return program


def test_honest_workers_restarting_while_a_cheap_cover_runs_keep_their_place_in_the_queue() -> None:
    # Round 23 (second helper), F3: one price-0 identity really delivering 12/s covered the need, so
    # the honest workers were never tried; 64 identities claiming 1/s joined after them. The honest
    # workers' restart (1,500 s) re-queued them behind the 64, and when the cover went silent
    # (2,000 s) each of those was tried first: 46.8% in rst2, honest workers 0 all hour. A worker
    # never tried (or whose proof lapsed idle) keeps its join place when it restarts.
    program: list[Move] = [(0, "join", 100, 12.0, 0.0, None), (0, "deliver", 100, ("real", 12.0))]
    program += [(2000, "deliver", 100, ("none",))]
    program += truthful_small_claims(64, silent_from=400)
    for world in ("rst2", "slowrst2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.9 * control(world).useful


def test_honest_workers_whose_proof_lapsed_idle_keep_their_place_when_they_restart() -> None:
    # Round 23 (second helper), F2: 64 price-0 identities delivering a true 1/s each covered the
    # need, so the proven honest workers went idle and their proofs lapsed; all 64 went silent at
    # 1,500 s, when the honest workers restarted and were queued behind them: 28.1% in rst2.
    program = truthful_small_claims(64, silent_from=1500)
    for world in ("rst2", "slowrst2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.9 * control(world).useful


def test_identities_restarting_once_each_do_not_hold_every_later_worker_for_the_hour() -> None:
    # Round 24: 32 price-0 identities proven on their true ~1/s, each restarting once just after the
    # newcomer joined (a proven restart keeps its join place), silent from 1,200 s. Counted as drops
    # of the role, the restarts held every worker proven later for the hour: 72.9% in new2. A
    # restart is now a drop of its own identity only: 83.8%, the queue limit (R11-4) alone.
    program: list[Move] = []
    for k in range(32):
        program += [(4 * k, "join", k, 1.0 + 0.01 * k, 0.0, None), (4 * k, "deliver", k, ("claim",))]
        program += [(1200, "deliver", k, ("none",)), (310 + k, "restart", k)]
    check("new2", program)


def test_leaving_and_rejoining_as_the_same_identity_counts_as_a_restart() -> None:
    # Round 25, F1: round 24's program with each restart replaced by a leave and a rejoin of the
    # same identity. A leave is a drop of the role, so the 32 leaves held every later worker for
    # the hour as the restarts had: 72.9% in new2. A leave's drop now counts only while that
    # identity is away: 83.7%, as with the restarts (the R11-4 queue alone).
    program = truthful_small_claims(32, silent_from=1200)
    for k in range(32):
        program += [(310 + k, "leave", k), (320 + k, "join", k, 1.0 + 0.01 * k, 0.0, None)]
    check("new2", program)


def test_honest_probationers_dropped_before_they_were_due_keep_their_join_place() -> None:
    # Round 25, F2: a price-0 cover really delivering 12/s slowed to 1/s at 300 s (the honest
    # workers went on probation) and recovered 45 s later, before their first delivery; dropped
    # unjudged, they became re-tries behind 64 silent identities, tried first once the cover went
    # silent at 600 s: 21.8% in first60, 17.3% in slowreal2. A trial dropped within
    # first_rollout_timeout (or out by its own D alone) keeps its place.
    program: list[Move] = [(0, "join", 200, 12.0, 0.0, None), (0, "deliver", 200, ("real", 12.0))]
    program += [(300, "deliver", 200, ("real", 1.0)), (345, "deliver", 200, ("real", 12.0))]
    program += [(600, "deliver", 200, ("none",))]
    for k in range(64):
        program += [(10 + 2 * k, "join", k, 1.0 + 0.01 * k, 0.0, None), (10 + 2 * k, "deliver", k, ("none",))]
    for world in ("first60", "slowreal2", "mixed2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.9 * control(world).useful


def test_an_identity_that_drops_itself_then_is_swapped_out_is_a_drop_of_the_role() -> None:
    # Round 25, F3 and F4: the round-21 rotation where each identity first restarts (a drop of its
    # own only) or re-advertises off its proof (unproven, no drop), then is swapped for a fresh
    # one (an unproven leave: no drop). No drop of the role was ever recorded, so each new identity
    # was trusted one hold after its proof: 72.8% (restart) and 73.8% (re-advertise) in first60.
    for program in (rotation(250, 190, restart_after=5), rotation(250, 190, readv=True)):
        for world in ("first60", "slowreal2"):
            outcome = check(world, program)
            assert outcome.useful >= 0.95 * control(world).useful


def silent_price_toggle(on: int, off: int) -> list[Move]:
    """One price-0 identity joining at 400 s (after the honest workers are trusted), proven on its
    real 12/s, silent from 620 s and from then re-advertising price 5 for ``off`` s and 0 for
    ``on`` s in turn (red team round 26)."""
    program: list[Move] = [(400, "join", 0, 12.0, 0.0, None), (400, "deliver", 0, ("claim",))]
    program += [(620, "deliver", 0, ("none",))]
    t = 620
    while t < 3600:
        program += [(t, "readv", 0, 12.0, 5.0, None)]
        program += [(t + off, "readv", 0, 12.0, 0.0, None)] if t + off < 3600 else []
        t += off + on
    return program


def test_a_silent_proven_identity_re_activated_by_its_own_offer_is_measured_before_it_is_trusted() -> None:
    # Round 26, F1: each price switch back to 0 re-activated it as trusted (its proof had not lapsed
    # idle), displacing the honest workers; silent for less than first_rollout_timeout each time,
    # it was never measured, so no drop was recorded: first60 0.7%, fast2 47.7%. A proven worker
    # deactivated before a window of that activation backed it is now untrusted until one does.
    for on, off in ((50, 50), (55, 30)):
        for world in ("first60", "fast2", "new2"):
            outcome = check(world, silent_price_toggle(on, off))
            assert outcome.useful >= 0.95 * control(world).useful


def test_silent_proven_identities_taking_turns_by_undercutting_each_other_do_not_starve_it() -> None:
    # Round 26, F1 (two identities): each re-advertised a price 0.001 below the other's every 50 s,
    # so neither deactivation was its own doing and each activation ended before it was measured:
    # 0.0% in all nine worlds.
    program: list[Move] = []
    for k in range(2):
        program += [
            (400 + 5 * k, "join", k, 12.0, 1.0 + 0.01 * k, None),
            (400 + 5 * k, "deliver", k, ("claim",)),
        ]
        program += [(600, "deliver", k, ("none",))]
    price, slot, t = 0.999, 1, 600
    while t < 3600:
        program += [(t, "readv", slot, 12.0, max(price, 0.0), None)]
        price, slot, t = price - 0.001, 1 - slot, t + 50
    for world in ("first60", "fast2", "slowreal2", "rst2"):
        check(world, program)


PROGRAMS = Path(__file__).parent / "programs"


def recorded(name: str) -> list[Move]:
    """A red team's program recorded as JSON (``adversary.py``'s moves, lists for tuples)."""
    moves = json.loads((PROGRAMS / name).read_text(encoding="utf-8"))
    return [tuple(tuple(x) if isinstance(x, list) else x for x in move) for move in moves]  # type: ignore[misc]


def undercutting_pair(join: int = 400, period: int = 75, silent: int = 26) -> list[Move]:
    """Round 27, F1: x covers at 12/s; y, proven and trusted, goes silent each period, and x's
    undercut 26 s later takes y out before its silence is adopted; y re-warms with one real window
    on probation beside x, and the cycle repeats."""
    p: list[Move] = [
        (join, "join", 0, 12.0, 0.5, 2.0),
        (join, "deliver", 0, ("real", 12.0)),
        (join, "join", 1, 12.0, 0.9, 2.0),
        (join, "deliver", 1, ("none",)),
        (join + 200, "readv", 1, 12.0, 0.4, 2.0),
        (join + 200, "deliver", 1, ("real", 12.0)),
    ]
    for c in range(join + 399, 3600, period):
        p += [(c, "readv", 0, 12.0, 0.9, 2.0), (c, "readv", 1, 12.0, 0.5, 2.0), (c, "deliver", 1, ("none",))]
        p += [(c + silent, "readv", 0, 12.0, 0.4, 2.0)]
        p += [(c + silent + 5, "readv", 1, 12.0, 0.9, 2.0), (c + silent + 5, "readv", 0, 12.0, 0.5, 2.0)]
        p += [(c + silent + 10, "readv", 1, 12.0, 0.4, 2.0), (c + silent + 10, "deliver", 1, ("real", 12.0))]
    return [m for m in p if m[0] < 3600]


def leave_and_return(period: int = 280) -> list[Move]:
    """Round 27, F3: one price-0 identity covering the need alone leaves at full rate, rejoins
    5 s later, is silent 91 s on trial, then delivers 12/s again; every ``period`` s."""
    p: list[Move] = [
        (0, "join", 0, 6.0, 1.0, 2.0),
        (0, "join", 1, 6.0, 1.0, 2.0),
        (400, "join", 2, 12.0, 0.0, 2.0),
        (400, "deliver", 2, ("real", 12.0)),
    ]
    for t in range(594, 3600, period):
        p += [(t, "leave", 2), (t + 5, "join", 2, 12.0, 0.0, 2.0), (t + 5, "deliver", 2, ("none",))]
        p += [(t + 96, "deliver", 2, ("real", 12.0))]
    return [m for m in p if m[0] < 3600]


def test_a_trusted_identity_taken_out_by_a_partners_undercut_is_benched_until_a_later_window() -> None:
    # Round 27, F1: y went silent and x's undercut deactivated it before its silence was adopted;
    # y was only `cold`, cleared by one window on probation beside x, trusted again, no drop ever
    # recorded: 58-61% of the completions in all nine worlds. A proven worker deactivated is now
    # benched (untrusted while another worker is trusted) until a window in a later activation.
    for world in ("first60", "rst2", "fast2"):
        outcome = check(world, undercutting_pair())
        assert outcome.useful >= 0.9 * control(world).useful


def test_an_identity_taking_itself_out_by_announcing_its_weights_late_is_benched() -> None:
    # Round 27, F2: covering alone, it announced one version 49 s late (own D past the bound), so
    # the re-plan deactivated it (nobody's re-advertisement: only `cold`), then went silent and
    # re-warmed on probation, repeatedly: first60 40.6%, fast2 81.3%.
    program = recorded("round27_late_announcements.json")
    assert check("first60", program).useful >= 0.8 * control("first60").useful
    assert check("fast2", program).useful >= 0.9 * control("fast2").useful


def test_leaving_at_full_rate_and_returning_is_a_drop_of_the_identity_itself() -> None:
    # Round 27, F3: the leave recorded only a role drop tagged with the identity, which stopped
    # counting once it was back, so it was never damped: 72.7% in first60.
    for world in ("first60", "slowreal2"):
        outcome = check(world, leave_and_return())
        assert outcome.useful >= 0.95 * control(world).useful


def test_a_rotation_of_identities_each_restarting_once_is_counted_for_the_role() -> None:
    # Round 27, F4: each identity restarted once (a drop of its own only) after displacing the
    # honest workers, the next one joined, proven, trusted one hold later: 73.2% in first60. An
    # identity's own drops now count for the role too, at most one per hold base (150 s).
    outcome = check("first60", recorded("round27_rotation_restarts.json"))
    assert outcome.useful >= 0.95 * control("first60").useful


def test_honest_workers_taken_out_by_a_cover_come_back_without_a_trial_token_or_place() -> None:
    # Round 28, F1: four price-0.25 covers of 3/s each, trusted, took the honest workers out of the
    # plan (benched, then their proofs lapsed idle); 16 fresh identities proven on 0.1/s were
    # refunded in turn and all left together within first_rollout_timeout (take-backs: tokens at
    # -8.5), and the covers slowed to 0.1/s: the honest workers waited ~300 s for a trial token,
    # every 600 s (46.1-55.7% in all nine worlds). Take-backs no longer go into debt, and a worker
    # taken out after it delivered a hold base comes back with no token or place.
    program = recorded("round28_token_debt.json")
    for world in ("first60", "fast2", "rst2", "slowrst2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.82 * control(world).useful


def test_fresh_silent_claims_filling_the_probation_places_do_not_keep_returning_workers_out() -> None:
    # Round 28, F2: the same covers; four fresh silent price-0 claims joined just before the
    # slowdown was adopted took every probation place for 120 s (73.4% in first60, 76.2% in
    # slowreal2).
    program = recorded("round28_silent_places.json")
    for world in ("first60", "slowreal2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.82 * control(world).useful


def test_a_short_activation_does_not_spend_a_returning_workers_free_return() -> None:
    # Round 29: round 28's silent places, with the covers dipping once more 200 s before each
    # slowdown (to 0.1/s for 60 s). Their recovery dropped the honest workers 56 s into their free
    # return, which spent it (``last_span``), and the silent claims then took every probation place
    # at the slowdown; in ``slowreal2`` the slow-link workers, dropped after their first delivery
    # while outside S * T, were failed claims too, re-tried behind later identities: 77.8% in
    # slowreal2, 79.1% in slowrst2, 83.0% in mixed2. A returned activation ended within a hold base,
    # not falling short, gives the return back; a worker outside the rule that the plan stops
    # needing is judged as one the plan made unneeded.
    program = recorded("round29_short_returns.json")
    for world in ("slowreal2", "slowrst2", "mixed2"):
        outcome = check(world, program)
        assert outcome.useful >= 0.82 * control(world).useful
