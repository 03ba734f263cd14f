"""smallinit's entry point: src/smallinit/cli.py (installed, also the `smallinit-sweep` command).

    python sweep.py                      train one trial with the defaults (src/smallinit/conf/config.yaml)
    python sweep.py model=mini init.gamma=0.5 norm.eps=1e-5
    python sweep.py -m init.gamma=0.5,0.75,1.0,1.25 norm.eps=1e-5,1e-12    a sweep
    python sweep.py --show [-m] OVERRIDES    what each trial would get (shape, budget, identity)
"""

import sys
from pathlib import Path

# This checkout's src/ first: the package runs from here even before (or without) `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from smallinit.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
