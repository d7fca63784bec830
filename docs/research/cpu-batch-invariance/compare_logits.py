"""max |logit diff| and greedy-token agreement between e2e arms. usage: compare_logits.py A.npz B.npz"""
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
for k in sorted(a.files):
    x, y = a[k], b[k]
    same_tok = (x.argmax(-1) == y.argmax(-1)).all()
    print(f"{k}: max|diff| prefill {np.abs(x[0]-y[0]).max():.3g}, over 9 steps {np.abs(x-y).max():.3g} "
          f"(logit range {np.abs(x).max():.1f}); greedy tokens equal: {same_tok}; bitwise equal: {np.array_equal(x, y)}")
