"""A pytest plugin for a machine without a GPU: the device probe of the test process says a GPU is usable, as on a
GPU machine, so that the CPU suite's fixture (``conftest._the_cpu_suite_on_the_cpu``) acts as it does there. Run
the CPU suite under it: ``python -m pytest -p tests.fake_gpu -m "not gpu"`` (the ``gpu`` tests would need a GPU).
The processes a test starts ask the real probe (no driver here, no device there): both send a run to the CPU."""

from __future__ import annotations


def pytest_configure(config):
    from gpubatch.engine import device

    device._gpu_problem = lambda index=0: (None, "a GPU (tests.fake_gpu)")
