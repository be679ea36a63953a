"""Two groups of processes in Linux network namespaces on one bridge, and a partition between them.

Layout (names carry a per-run suffix; the subnet is a free 10.231.x.0/24):

    hub namespace: bridge  <- veth -> namespace A (.2)
                           <- veth -> namespace B (.3)
                           <- veth -> the test's own namespace (.1), to read each node's API

``partition()`` adds a blackhole route to the other group's address in each namespace (their
packets to each other are dropped; both still reach the test); ``heal()`` removes it.
Needs root and iproute2; ``NetnsUnavailable`` says what failed. ``close()`` deletes everything.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be set up here (not root, no iproute2, no veth/bridge support)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class Partitionable:
    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{random.randrange(100)}"
        self.ns = {"A": f"snA{tag}", "B": f"snB{tag}"}
        self.hub = f"snH{tag}"
        self.root_if = f"snr{tag}"
        self.subnet = self._free_subnet()
        self.address = {"A": f"{self.subnet}.2", "B": f"{self.subnet}.3", "test": f"{self.subnet}.1"}
        self._made_ns: list[str] = []
        self._made_root_if = False
        self.partitioned = False

    @staticmethod
    def _free_subnet() -> str:
        try:
            routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NetnsUnavailable(f"cannot run `ip route`: {exc}") from exc
        for third in random.sample(range(1, 255), 254):
            if f"10.231.{third}." not in routes:
                return f"10.231.{third}"
        raise NetnsUnavailable("no free 10.231.x.0/24 subnet")

    def open(self) -> Partitionable:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (euid is not 0)")
        try:
            for name in (self.hub, *self.ns.values()):
                _ip("netns", "add", name)
                self._made_ns.append(name)
                _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for group, ns in self.ns.items():
                inner, outer = f"v{group}", f"h{group}"
                _ip("-n", ns, "link", "add", inner, "type", "veth", "peer", "name", outer, "netns", self.hub)
                _ip("-n", self.hub, "link", "set", outer, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.address[group]}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
            _ip("link", "add", self.root_if, "type", "veth", "peer", "name", "hT", "netns", self.hub)
            self._made_root_if = True
            _ip("-n", self.hub, "link", "set", "hT", "master", "br0", "up")
            _ip("addr", "add", f"{self.address['test']}/24", "dev", self.root_if)
            _ip("link", "set", self.root_if, "up")
        except NetnsUnavailable:
            self.close()
            raise
        return self

    def exec_prefix(self, group: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[group]]

    def _blackholes(self, action: str) -> None:
        _ip("-n", self.ns["A"], "route", action, "blackhole", f"{self.address['B']}/32")
        _ip("-n", self.ns["B"], "route", action, "blackhole", f"{self.address['A']}/32")

    def partition(self) -> None:
        self._blackholes("add")
        self.partitioned = True

    def heal(self) -> None:
        self._blackholes("del")
        self.partitioned = False

    def close(self) -> None:
        if self._made_root_if:
            with contextlib.suppress(NetnsUnavailable):
                _ip("link", "del", self.root_if)
            self._made_root_if = False
        for name in reversed(self._made_ns):
            with contextlib.suppress(NetnsUnavailable):
                _ip("netns", "del", name)
        self._made_ns.clear()
