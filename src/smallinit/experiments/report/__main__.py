"""`python -m smallinit.experiments.report`: the same command as `...report.report` (make report)."""

import sys

from .report import main

sys.exit(main())
