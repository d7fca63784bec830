"""Diagnostic: the prompt's and the first decode rows' log-probabilities of one request on the CPU and the GPU, side by
side (where logprobs_check.py says they differ, this says which rows): on the device, after gpu_run.sh has made the
model, `PYTHONPATH=/tmp/site python3 tools/device/logprobs_probe.py MODEL`."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from protocol import messages as m  # noqa: E402
from tests.harness import PY, EngineProcess  # noqa: E402

ids = tuple(int(t) for t in np.random.default_rng(4).integers(100, 20000, 40))
for device in ("cpu", "gpu"):
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", device, "--model", sys.argv[1], "--ctx", "2048"])
    e.handshake()
    try:
        e.send(m.Gen(6, ids, {"temperature": 0.0, "prompt_logprobs": 3, "logprobs": 3, "reuse": 0}, 1))
        lines = e.read_until(m.Done, ident=1)
        plp = [x for x in lines if isinstance(x, m.PromptLogprobs)]
        vals = [v for x in plp for v in x.logprobs]
        tops = [t for x in plp for t in x.top]
        toks = [(x.token, x.logprob, x.top) for x in lines if isinstance(x, m.Token)]
        print(device, "prompt lp first", np.round(vals[:4], 3).tolist(), "last", np.round(vals[-3:], 3).tolist())
        print(device, "prompt top first", tops[0], "last", tops[-1])
        print(device, "decode", toks[:2])
    finally:
        e.close()
