"""The decode route as the load on the host changes while a run goes on.

"auto" chooses the route when the pipeline is made, by the cores free then
(:func:`~gpubatch.engine.codecs.decode_routing.choose_route`): "split" (the CUDA decoder takes about
30% of each batch, at about 1 ms of CPU an image, on ten or so threads) where at least
``Settings.split_min_cores`` are free, else "hardware" (the hardware engine takes every kind it
decodes, at a twentieth of the CPU). Work that starts later (another run, a training job's loaders, a
compile) was not seen: with 8 busy processes started 3 s after the run, the split route ran the
training chain at 10,300-11,800 images/s, the hardware route (chosen at the start) at 20,200-21,100,
and the route following the load at 17,900-20,800, switched 2 s into the run (H100, 2026-11-23;
docs/engine.md). On an idle host it never switched and ran as the fixed route did.

:class:`RouteFollower` applies the same rule as the run goes: every ``Settings.follow_check_s``
seconds the decoder asks it with the cores other processes kept busy meanwhile
(:class:`~gpubatch.engine.gpu.affinity.HostLoad` on its cores), and it changes the route once
``confirm`` checks in a row have wanted the other one, leaving the split route only ``margin``
below the threshold and keeping a route at least ``hold`` seconds (a switch gives buffers back and
grows others).

A first try balanced the CUDA decoder's share by each decoder thread's busy seconds per image: it
raised the share where it should have lowered it (0.30 to 0.44 beside 8 busy processes, slower than
the fixed share), as the hardware engine's thread also waits for the GPU, which the CUDA decoder's
kernels keep busy; the threads' busy time is not what sets the pace. Not kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RouteFollower:
    """The route ("split" or "hardware") for ``cores`` usable cores: "split" while at least
    ``split_min`` of them are left by other processes (less ``margin`` to leave it), else "hardware";
    changed only after ``confirm`` checks in a row want the other one, and not within ``hold``
    seconds of the last change. ``switches`` records each change (seconds into the run, the new
    route, the free cores that decided it)."""

    route: str
    cores: float
    split_min: float
    confirm: int = 2  # (Settings.follow_confirm, follow_margin, follow_hold_s)
    margin: float = 0.5
    hold: float = 10.0
    pending: int = 0
    checks: int = 0
    switches: list[tuple[float, str, float]] = field(default_factory=list)

    def observe(self, others: float, at: float) -> str:
        """The route after a check that found ``others`` cores busy in other processes, ``at`` seconds
        into the run."""
        self.checks += 1
        free = self.cores - others
        want = "split" if free >= self.split_min - (self.margin if self.route == "split" else 0.0) else "hardware"
        if want == self.route or (self.switches and at - self.switches[-1][0] < self.hold):
            self.pending = 0
            return self.route
        self.pending += 1
        if self.pending >= self.confirm:
            self.route, self.pending = want, 0
            self.switches.append((round(at, 1), want, round(free, 1)))
        return self.route
