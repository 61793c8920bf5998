import sys

from rlhf_tutorial.cli import main

sys.exit(main())
