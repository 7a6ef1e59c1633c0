"""``python -m scalerl.sweep`` = ``python sweep.py``."""

import sys

from scalerl.sweep.cli import main

sys.exit(main())
