import sys

from torchfeed.cli import main

sys.exit(main())
