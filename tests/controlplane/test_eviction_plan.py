"""How many low-priority claims a high-priority claim evicts, card by card and node by node:
the fewest that give it memory and a vGPU slot, youngest first (pure planning, no database)."""

from __future__ import annotations

import uuid

from qshare.contracts.domain import Priority
from qshare_allocator.placement.demand import Demand
from qshare_allocator.placement.eviction_plan import CardState, Victim, card_victims, node_victims


def _victim(mib: int, gpu: str = "card-0", claim: uuid.UUID | None = None) -> Victim:
    return Victim(claim or uuid.uuid4(), "t", "node-a", gpu, mib, 30.0)


def _card(free: int, *victims: Victim, count: int | None = None, slots: int = 4) -> CardState:
    used = len(victims) if count is None else count
    return CardState("card-0", "node-a", free, used, slots, list(victims))


HIGH = Demand(priority=Priority.HIGH, vcore=40, vmemory_mib=4096, count=1)


def test_a_card_with_room_needs_no_victim() -> None:
    assert card_victims(_card(8192, _victim(1024)), HIGH) == []


def test_the_youngest_claims_go_first_until_the_memory_is_enough() -> None:
    young, older, oldest = _victim(2048), _victim(2048), _victim(2048)
    assert card_victims(_card(0, young, older, oldest), HIGH) == [young, older]


def test_a_full_card_gives_up_one_vgpu_slot_even_when_memory_is_free() -> None:
    victims = [_victim(1024) for _ in range(4)]
    assert card_victims(_card(12288, *victims), HIGH) == victims[:1]


def test_a_card_that_not_even_all_its_victims_would_free_is_no_option() -> None:
    assert card_victims(_card(0, _victim(2048)), HIGH) is None


def test_a_whole_card_needs_every_vgpu_on_it_evictable() -> None:
    whole = Demand(priority=Priority.HIGH, vcore=100, vmemory_mib=0, count=1, whole=True)
    victims = [_victim(1024), _victim(1024)]
    assert card_victims(_card(0, *victims), whole) == victims
    assert card_victims(_card(0, *victims, count=3), whole) is None


def test_a_claim_of_two_cards_takes_the_two_cheapest_cards_of_the_node() -> None:
    two = Demand(priority=Priority.HIGH, vcore=40, vmemory_mib=4096, count=2)
    cheap, dear = _victim(4096), [_victim(2048), _victim(2048)]
    cards = [_card(0, cheap), _card(0, *dear), _card(8192)]
    assert node_victims(cards, two) == [cheap]


def test_a_node_with_too_few_possible_cards_gives_no_victims() -> None:
    two = Demand(priority=Priority.HIGH, vcore=40, vmemory_mib=4096, count=2)
    assert node_victims([_card(0, _victim(4096)), _card(0, _victim(1024))], two) == []


def test_a_claim_on_two_of_the_chosen_cards_is_evicted_once() -> None:
    two = Demand(priority=Priority.HIGH, vcore=40, vmemory_mib=4096, count=2)
    claim = uuid.uuid4()
    cards = [_card(0, _victim(4096, "card-0", claim)), _card(0, _victim(4096, "card-1", claim))]
    assert [v.claim_id for v in node_victims(cards, two)] == [claim]


def test_a_young_claim_too_small_to_matter_is_not_evicted_beside_one_that_frees_enough() -> None:
    """Youngest first among the fewest that free enough: evicting the young 1 GiB claim and
    the older 4 GiB one would be one eviction more than needed."""
    young, older = _victim(1024), _victim(4096)
    assert card_victims(_card(0, young, older), HIGH) == [older]


def test_among_equally_few_victims_the_youngest_go() -> None:
    young, middle, old = _victim(4096), _victim(4096), _victim(4096)
    assert card_victims(_card(0, young, middle, old), HIGH) == [young]
