"""The runtime (trio + MockClock calendar) and the network model."""

from __future__ import annotations

import pytest
import trio

from swarmnode.sim.engine import Simulation
from swarmnode.sim.network import MBPS, Network


def test_calendar_runs_in_time_order_and_trio_clock_agrees() -> None:
    sim = Simulation(0)
    seen: list[tuple[str, float, float]] = []

    def note(tag: str) -> None:
        seen.append((tag, sim.now, trio.current_time()))

    sim.at(5.0, note, "b")
    sim.at(1.0, note, "a")
    sim.at(5.0, note, "c")  # same time: scheduling order
    sim.run(10.0)
    assert [s[0] for s in seen] == ["a", "b", "c"]
    assert all(s[1] == pytest.approx(s[2]) for s in seen)
    assert sim.now == 10.0


def test_process_tasks_sleep_on_the_virtual_clock_one_at_a_time() -> None:
    sim = Simulation(0)
    log: list[tuple[str, float]] = []

    async def ticker(name: str, period: float) -> None:
        for _ in range(3):
            await sim.sleep(period)
            log.append((name, sim.now))

    sim.process(ticker, "fast", 1.0)
    sim.process(ticker, "slow", 1.5)
    sim.run(100.0)
    # At t=3 both wake; "slow" went to sleep first (at 1.5, "fast" at 2.0), so it runs first.
    assert log == [("fast", 1.0), ("slow", 1.5), ("fast", 2.0), ("slow", 3.0), ("fast", 3.0), ("slow", 4.5)]


def two_hosts(up: float, down: float, latency: float = 0.01) -> tuple[Simulation, Network, list]:
    sim = Simulation(0)
    net = Network(sim)
    hosts = [net.add_host(f"h{i}", up=up * MBPS, down=down * MBPS, latency=latency) for i in range(4)]
    return sim, net, hosts


def test_a_lone_transfer_runs_at_the_slower_port_plus_latency() -> None:
    sim, net, (a, b, *_) = two_hosts(up=80, down=8)
    arrived: list[float] = []
    net.transfer(a, b, 1_000_000, lambda: arrived.append(sim.now))
    sim.run(100)
    assert arrived == [pytest.approx(1_000_000 / (8 * MBPS) + 0.01)]


def test_a_fast_uplink_feeds_slow_receivers_side_by_side_and_a_bottleneck_serializes() -> None:
    sim, net, (a, b, c, d) = two_hosts(up=100, down=10)
    arrived: dict[str, float] = {}
    for dst in (b, c):
        net.transfer(a, dst, 1_250_000, lambda name=dst.name: arrived.__setitem__(name, sim.now))
    # Two transfers into one downlink share it: the second ends one transfer time later.
    net.transfer(c, d, 1_250_000, lambda: arrived.__setitem__("d1", sim.now))
    net.transfer(b, d, 1_250_000, lambda: arrived.__setitem__("d2", sim.now))
    sim.run(100)
    one = 1_250_000 / (10 * MBPS)  # 1 s at 10 Mbit/s
    assert arrived["h1"] == pytest.approx(one + 0.01)
    assert arrived["h2"] == pytest.approx(one + 0.01)
    assert arrived["d1"] == pytest.approx(one + 0.01)
    assert arrived["d2"] == pytest.approx(2 * one + 0.01)


def test_nothing_reaches_or_leaves_a_host_that_went_down() -> None:
    sim, net, (a, b, *_) = two_hosts(up=8, down=8)
    got: list[str] = []
    net.transfer(a, b, 1_000_000, lambda: got.append("bulk"))
    net.send(b, a, lambda: got.append("to-a"))
    sim.at(0.001, net.down, a)
    sim.run(100)
    assert got == []
    assert net.messages_dropped == 2


def test_loss_drops_about_the_configured_share() -> None:
    sim = Simulation(1)
    net = Network(sim, loss=0.2)
    a = net.add_host("a", up=1e9, down=1e9, latency=0.0)
    b = net.add_host("b", up=1e9, down=1e9, latency=0.0)
    got: list[int] = []
    for i in range(2000):
        net.send(a, b, got.append, i)
    sim.run(1)
    assert 1450 < len(got) < 1750
