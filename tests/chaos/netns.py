"""Network namespaces joined by one bridge, for partition tests (Linux, root, iproute2).

:class:`NetLab` makes ``n`` namespaces, each with a veth pair whose outer end is a port of a
bridge in the root namespace (which has an address too, so the test process reaches every
namespace); :meth:`NetLab.isolate` takes a namespace's link down (a partition: nothing in or
out), :meth:`NetLab.heal` brings it back, :meth:`NetLab.separate` cuts two namespaces off from
each other only (the "bridge" topology). Every name carries this process's PID, so runs side by
side never meet, and :meth:`NetLab.destroy` removes everything it made (deleting a veth's outer
end deletes the pair; deleting a namespace kills nothing, the test stops its processes first).
``tc netem`` and iptables are not used: the machines these tests run on lack both.

:func:`unavailable` says why the lab cannot be built here (not root, no ``ip``, namespaces
refused), for ``pytest.skip``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    probe = f"orbprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class NetLab:
    def __init__(self, n: int) -> None:
        tag = os.getpid() % 100000
        self.n = n
        self.netns = [f"orbns{tag}-{i}" for i in range(1, n + 1)]
        self.veths = [f"orbv{tag}x{i}" for i in range(1, n + 1)]
        self.bridge = f"orbbr{tag}"
        self.subnet = self._free_subnet()
        self.hosts = [f"{self.subnet}.{i}" for i in range(1, n + 1)]
        self._made: list[tuple[str, ...]] = []

    @staticmethod
    def _free_subnet() -> str:
        used = _ip("-o", "addr").stdout
        rng = random.Random()
        for _ in range(100):
            subnet = f"10.{rng.randrange(200, 250)}.{rng.randrange(1, 250)}"
            if f" {subnet}." not in used:
                return subnet
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    def create(self) -> NetLab:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", "del", self.bridge))
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for ns, veth, host in zip(self.netns, self.veths, self.hosts, strict=True):
                _ip("netns", "add", ns)
                self._made.append(("netns", "del", ns))
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._made.append(("link", "del", veth))
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{host}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def isolate(self, i: int) -> None:
        """Cut namespace ``i`` (0-based) off: its link goes down."""
        _ip("link", "set", self.veths[i], "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.veths[i], "up")

    def separate(self, i: int, j: int, *, on: bool = True) -> None:
        """The "bridge" fault: namespaces ``i`` and ``j`` cannot reach each other, each still
        reaches the others (bridge port isolation: isolated ports talk to unisolated ones only)."""
        for k in (i, j):
            subprocess.run(
                ["bridge", "link", "set", "dev", self.veths[k], "isolated", "on" if on else "off"],
                capture_output=True, text=True, check=True, timeout=30,
            )  # fmt: skip

    def destroy(self) -> None:
        """Remove what :meth:`create` made, newest first; errors are ignored (already gone)."""
        for args in reversed(self._made):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _ip(*args, check=False)
        self._made.clear()
