"""``python -m ringcomm.bench``."""
from .cli import main

raise SystemExit(main())
