"""Stan's windowed warmup schedule (``windowed_adaptation.hpp``).

An initial fast buffer (step size only), then slow windows that double in length, each
ending in a metric update, then a terminal fast buffer. Defaults 75 / 25 / 50. When they
do not fit, the buffers become 15 % and 10 % of the warmup and the single window takes the
rest; under 20 warmup iterations the metric is not adapted at all. A window whose
successor would overrun the terminal buffer is stretched to reach it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["WarmupSchedule", "build_schedule", "schedule_from_windows"]


class WarmupSchedule(NamedTuple):
    """The schedule of ``num_warmup`` iterations (0-based).

    windows : ``[(first, last), ...]`` inclusive slow windows; the metric is updated at the
        end of iteration ``last`` of each.
    in_window, window_end : ``(num_warmup,)`` bool tensors on the chains' device,
        indexable by each chain's own iteration number.
    """

    num_warmup: int
    windows: list[tuple[int, int]]
    in_window: torch.Tensor
    window_end: torch.Tensor

    @property
    def adapts_metric(self) -> bool:
        return bool(self.windows)

    def ends_window(self, iteration: int) -> bool:
        """Whether the metric is updated after warmup iteration ``iteration`` (on the
        host, without reading ``window_end``)."""
        return any(last == iteration for _, last in self.windows)


def build_schedule(
    num_warmup: int,
    init_buffer: int = 75,
    term_buffer: int = 50,
    base_window: int = 25,
    device: torch.device | str = "cpu",
) -> WarmupSchedule:
    """Stan's schedule for ``num_warmup`` iterations (see the module docstring), its
    masks on ``device`` (made once: a copy from the host per use would wait for it)."""
    if num_warmup < 20:
        return schedule_from_windows(num_warmup, [], device)
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer = int(0.15 * num_warmup)
        term_buffer = int(0.10 * num_warmup)
        base_window = num_warmup - (init_buffer + term_buffer)
    last = num_warmup - term_buffer - 1
    windows = []
    size, end = base_window, init_buffer + base_window - 1
    start = init_buffer
    while True:
        windows.append((start, end))
        if end == last:
            break
        size *= 2
        start, end = end + 1, end + size
        if end != last and end + 2 * size >= num_warmup - term_buffer:
            end = last
    return schedule_from_windows(num_warmup, windows, device)


def schedule_from_windows(
    num_warmup: int, windows: list[tuple[int, int]], device: torch.device | str = "cpu"
) -> WarmupSchedule:
    """The schedule of ``num_warmup`` iterations with the given consecutive ``windows``."""
    in_window = torch.zeros(num_warmup, dtype=torch.bool)
    window_end = torch.zeros(num_warmup, dtype=torch.bool)
    for start, stop in windows:
        in_window[start : stop + 1] = True
        window_end[stop] = True
    return WarmupSchedule(num_warmup, windows, in_window.to(device), window_end.to(device))
