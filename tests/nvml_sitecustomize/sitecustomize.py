"""Put on PYTHONPATH of a `stalldoc watch` process to give it two scripted GPUs: the `pynvml`
functions are replaced, nothing above them. (The job's processes inherit it; they never call
NVML.)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fake_pynvml import FakeGpu, FakeNvml  # noqa: E402


class _Direct:
    setattr = staticmethod(setattr)


FakeNvml([FakeGpu("GPU-0", used=30 * 2**30, util=85, tx_kbps=4096, rx_kbps=8192, counters=False),
          FakeGpu("GPU-1", used=12 * 2**30, util=3, counters=False)]).install(_Direct)
