"""``python -m ringcomm.apps.train``."""
import sys

from .cli import main

sys.exit(main())
