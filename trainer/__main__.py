"""`python -m trainer ...`, started by torchrun once per rank."""

import sys

from trainer.train import main

sys.exit(main())
