"""Hosts on one machine: each a network namespace with its own address on a private bridge.

A process started on a host (`Place.command`) sees only that host's network: its own loopback
and its address on the bridge, so hosts reach each other only over the bridge, as separate
machines do over a LAN. A host can also be unplugged from the bridge: what it runs goes on,
unheard, and nothing it had open is closed, as when a machine loses power or its network. The
machine itself sits on the bridge at `.1`. Needs root (`ip netns`, veth pairs).
"""

from __future__ import annotations

import re
import subprocess

from launcher.process import Place


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Network:
    """Namespaces named `<prefix>-<host>` on the bridge `<prefix>-br`, addresses `<subnet>.N/24`.

    `subnet` is a private /24 (e.g. "10.77.0"); nothing is routed beyond it. Creating a network
    first removes whatever a killed run with the same prefix left behind.
    """

    def __init__(self, prefix: str, subnet: str) -> None:
        self.prefix = prefix
        self.subnet = subnet
        self.bridge = f"{prefix}-br"
        self.hosts: dict[str, Place] = {}
        self._cables: dict[str, str] = {}  # host -> its veth's end on the bridge

    @property
    def gateway(self) -> str:
        """This machine's address on the bridge."""
        return f"{self.subnet}.1"

    def create(self) -> None:
        self.destroy()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def host(self, name: str, number: int) -> Place:
        """A new host with address `<subnet>.<number>`."""
        namespace = f"{self.prefix}-{name}"
        outside = f"{self.prefix}{number}"  # interface names are at most 15 characters
        address = f"{self.subnet}.{number}"
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        place = Place(address=address, prefix=("ip", "netns", "exec", namespace))
        self.hosts[name] = place
        self._cables[name] = outside
        return place

    def unplug(self, name: str) -> None:
        """The host drops off the network: its packets go nowhere and nobody's reach it."""
        _ip("link", "set", self._cables[name], "down")

    def plug(self, name: str) -> None:
        _ip("link", "set", self._cables[name], "up")

    def cut(self, name: str, to_address: str) -> None:
        """What the host sends to `to_address` goes nowhere, silently (a one-way fault); what
        it sends elsewhere, and what it receives, still arrive."""
        _ip("-n", f"{self.prefix}-{name}", "route", "add", "blackhole", f"{to_address}/32")

    def destroy(self) -> None:
        """Remove every host's cable, every namespace with this prefix, and the bridge. The
        cables go first and at once: a deleted namespace's own end of its cable is removed by
        the kernel later, which could still be under way when the next run makes its hosts."""
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(": ")[1].split("@")[0]
            if re.fullmatch(rf"{re.escape(self.prefix)}\d+", name):
                _ip("link", "delete", name, check=False)
        listed = _ip("netns", "list", check=False).stdout.splitlines()
        for line in listed:
            namespace = line.split()[0] if line.split() else ""
            if namespace.startswith(f"{self.prefix}-"):
                _ip("netns", "delete", namespace, check=False)
        _ip("link", "delete", self.bridge, check=False)
        self.hosts, self._cables = {}, {}
