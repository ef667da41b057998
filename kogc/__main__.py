"""`python -m kogc ...`: the `kogc` command (where the package is on PYTHONPATH but not installed)."""
import sys

from .cli import main

sys.exit(main())
