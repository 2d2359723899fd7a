import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
# harness/ (shared with bench/) under the repo root; what several rooms of the tests share in support/
sys.path[:0] = [p for p in (os.path.dirname(TESTS), os.path.join(TESTS, "support")) if p not in sys.path]
