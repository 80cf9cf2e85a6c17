"""The joint assignment of free cards to competing deployments (planning/card_shares.py) against the
greedy order it replaces and against a brute-force optimum."""

from __future__ import annotations

import itertools
import random

from controlplane.planning.card_shares import NEED_STEPS, Claimant, assign, greedy, in_steps, score


def brute_force(claimants, cards):
    """Every way to give each card to one claimant or to nobody: the best score."""
    options = [None, *(c.name for c in claimants)]
    return max(score(claimants, {card: who for card, who in zip(cards, pick, strict=True) if who})
               for pick in itertools.product(options, repeat=len(cards)))


def test_joint_beats_greedy_where_an_old_card_is_worth_more_to_the_model_that_runs_it_at_int4():
    cards = ["new/gpu0", "old/gpu0"]
    # "big" has the priority and may run the old card only at 16 bits (its quality budget): 30 tokens/s;
    # "small" may go to int4 there: 50 tokens/s. Both are fast on the new card.
    big = Claimant("big", priority=1, need=30, worth={"new/gpu0": 90, "old/gpu0": 30})
    small = Claimant("small", priority=0, need=80, worth={"new/gpu0": 80, "old/gpu0": 50})
    first_come = greedy([big, small], cards)
    assert first_come == {"new/gpu0": "big", "old/gpu0": "small"}
    assert score([big, small], first_come) == (30, 50, -2)  # small short of its need
    joint = assign([big, small], cards)
    assert joint == {"old/gpu0": "big", "new/gpu0": "small"}
    assert score([big, small], joint) == (30, 80, -2)


def test_joint_meets_both_where_greedy_starves_the_lower_priority():
    cards = ["new/gpu0", "old/gpu0"]
    big = Claimant("big", priority=1, need=60, worth={"new/gpu0": 90, "old/gpu0": 60})
    small = Claimant("small", priority=0, need=70, worth={"new/gpu0": 80, "old/gpu0": 0})  # no fit on old
    first_come = greedy([big, small], cards)
    joint = assign([big, small], cards)
    assert first_come == {"new/gpu0": "big"} and score([big, small], first_come) == (60, 0, -1)
    assert joint == {"old/gpu0": "big", "new/gpu0": "small"} and score([big, small], joint) == (60, 70, -2)


def test_priority_takes_the_last_free_cards_under_scarcity():
    cards = ["a/gpu0", "a/gpu1"]  # the last two free cards; each deployment needs both for a replica
    busier = Claimant("busier", priority=0, need=100, worth={"a/gpu0": 50, "a/gpu1": 50})
    higher = Claimant("higher", priority=5, need=80, worth={"a/gpu0": 40, "a/gpu1": 40})
    assert assign([busier, higher], cards) == {"a/gpu0": "higher", "a/gpu1": "higher"}


def test_priority_comes_first_even_at_a_loss_of_total_worth():
    cards = ["new/gpu0"]
    high = Claimant("high", priority=2, need=10, worth={"new/gpu0": 10})
    low = Claimant("low", priority=0, need=500, worth={"new/gpu0": 500})
    assert assign([high, low], cards) == {"new/gpu0": "high"}


def test_the_joint_assignment_is_the_brute_force_optimum_on_small_random_cases():
    rng, greedy_worse = random.Random(11), 0
    for _ in range(150):
        cards = [f"c{i}" for i in range(rng.randint(1, 5))]
        claimants = [Claimant(f"d{j}", priority=rng.randint(0, 1), need=rng.randint(10, 150),
                              worth={c: rng.choice((0, 10, 30, 50, 80)) for c in cards})
                     for j in range(rng.randint(1, 3))]
        joint = assign(claimants, cards)
        assert set(joint) <= set(cards)
        assert score(claimants, joint) == brute_force(claimants, cards)
        assert score(claimants, joint) >= score(claimants, greedy(claimants, cards))
        greedy_worse += score(claimants, joint) > score(claimants, greedy(claimants, cards))
    assert greedy_worse >= 10  # the cases do tell the two apart


def test_in_steps_counts_each_need_in_steps_and_keeps_the_joint_answer():
    big = Claimant("big", priority=1, need=30, worth={"new/gpu0": 90, "old/gpu0": 30, "tiny/gpu0": 0})
    small = Claimant("small", priority=0, need=800, worth={"new/gpu0": 800, "old/gpu0": 500, "tiny/gpu0": 19})
    counted = {c.name: c for c in in_steps([big, small])}
    assert counted["big"].need == counted["small"].need == NEED_STEPS
    assert counted["big"].worth == {"new/gpu0": 60, "old/gpu0": 20, "tiny/gpu0": 0}
    assert counted["small"].worth == {"new/gpu0": 20, "old/gpu0": 12, "tiny/gpu0": 0}  # 19 < half a step
    cards = ["new/gpu0", "old/gpu0", "tiny/gpu0"]
    assert assign(list(counted.values()), cards) == assign([big, small], cards) == {
        "old/gpu0": "big", "new/gpu0": "small"}
    assert in_steps([Claimant("idle", 0, 0, {"new/gpu0": 50})])[0].worth == {"new/gpu0": 0}
