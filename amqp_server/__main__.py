import sys

from .node.server import main

sys.exit(main())
