"""``python -m mgmt_http.warrenctl``: the same as the ``warrenctl`` script."""
import sys

from .main import main

sys.exit(main())
